"""atroposlib.frontend."""
