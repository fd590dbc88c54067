"""Reserved for a later issue; see ../shared/DESIGN.md."""
