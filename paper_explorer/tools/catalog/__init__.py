"""The built-in tools, one module each: its arguments, its function and its ``TOOL`` declaration.

Every module here is registered by ``tools.registry`` when it is first read; adding a module here
adds a tool (docs/sandbox.md, "Add a tool"). This package imports nothing itself.
"""
