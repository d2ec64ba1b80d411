"""atroposlib 0.4.0's public surface, implemented on atropos_cli (see atropos_cli.compat)."""

__version__ = "0.4.0"
