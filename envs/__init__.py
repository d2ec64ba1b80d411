"""Bundled environments, one module each; imported as the package `atropos_cli.envs` (see atropos_cli.env.registry)."""
