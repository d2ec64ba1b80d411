"""atroposlib.envs.server_handling.trl_vllm_server: `TrlVllmServer` (TRL's `vllm-serve`)."""

from atropos_cli.compat.atroposlib.envs.server_handling.server_baseline import APIServer

__all__ = ["TrlVllmServer"]


class TrlVllmServer(APIServer):
    """A TRL vllm-serve server."""
