"""atroposlib.envs.server_handling.sglang_server: `SGLangServer` (text through the OpenAI routes; token ids
through the completions route, which SGLang answers with ids when asked)."""

from atropos_cli.compat.atroposlib.envs.server_handling.server_baseline import APIServer

__all__ = ["SGLangServer"]


class SGLangServer(APIServer):
    """An SGLang server."""
