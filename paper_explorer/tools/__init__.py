"""What the policy may call, and the sandbox its code runs in.

Import from the submodules (``tools.paper_tools``, ``tools.page``, ``tools.sandbox``): this package
imports nothing itself, so the sandbox's zygote can load ``tools.worker`` without the corpus,
numpy or pydantic.
"""
