"""atroposlib.envs."""
