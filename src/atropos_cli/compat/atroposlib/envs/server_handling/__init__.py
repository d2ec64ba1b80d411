"""atroposlib.envs.server_handling."""
