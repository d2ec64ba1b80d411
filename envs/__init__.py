"""Bundled environments, one module each; imported as the package `atropos_envs` (see atropos_cli.registry)."""
