"""What the policy may call: search, read, extract, submit and abstain, and their documentation page."""

from tools.errors import ToolError
from tools.page import tool_page
from tools.paper_tools import TOOLS, Outcome, PaperTools, ToolCall

__all__ = ["TOOLS", "Outcome", "PaperTools", "ToolCall", "ToolError", "tool_page"]
