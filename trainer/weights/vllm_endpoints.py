"""HTTP client for the vLLM endpoints that change a running server's weights without restarting it.

Where it sits: `vllm.py`'s `VLLMSync` calls these between optimizer steps. Two families, both off by default in
vLLM and switched on by the child env that `VLLMServer` sets (trusted localhost servers only):

- dev mode (`VLLM_SERVER_DEV_MODE=1`, vLLM >= 0.11 layout, verified on 0.32): `POST /pause?mode=wait`,
  `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}` (every worker reloads
  the checkpoint in place), `POST /reset_prefix_cache`, `POST /update_weight_version`, `POST /resume`,
  `GET /is_paused` (our probe), `GET /server_info` (the device, for the CPU caveat in vllm.py);
- runtime LoRA (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` + `--enable-lora`): `POST /v1/load_lora_adapter` with
  `load_inplace: true` replaces an adapter's weights under the same name.

Every call has a timeout; a refused or unreachable call raises `EndpointError` naming the endpoint and the HTTP
status, which `VLLMSync` turns into a message with the step and the checkpoint path.
"""

from __future__ import annotations

from typing import Any

import httpx

from atropos_cli.errors import EndpointError

__all__ = ["VLLMEndpoints", "EndpointError"]


class VLLMEndpoints:
    """The weight-update endpoints of one vLLM server at `root` (http://host:port, no /v1)."""

    def __init__(self, root: str, timeout: float) -> None:
        self.root, self.timeout = root.rstrip("/").removesuffix("/v1"), timeout

    def has_dev_mode(self) -> bool:
        """True when the server exposes the dev endpoints (GET /is_paused answers 200), False on 404."""
        try:
            response = httpx.get(self.root + "/is_paused", timeout=min(self.timeout, 30.0))
        except httpx.TransportError as exc:
            raise EndpointError("GET /is_paused", None, type(exc).__name__) from None
        return response.status_code == 200

    def device(self) -> str | None:
        """The device vLLM runs on ("cuda", "cpu", ...) from the dev route GET /server_info; None if unknown."""
        try:
            info = self._call("GET", "/server_info", params={"config_format": "json"}).json()
        except EndpointError:
            return None
        return ((info.get("vllm_config") or {}).get("device_config") or {}).get("device")

    def pause(self) -> None:
        # mode=wait: requests in flight finish on the old weights (none are, between steps in our loop)
        self._call("POST", "/pause", params={"mode": "wait"})

    def resume(self) -> None:
        self._call("POST", "/resume")

    def reload_weights(self, path: str) -> None:
        body = {"method": "reload_weights", "kwargs": {"weights_path": path}, "timeout": self.timeout}
        self._call("POST", "/collective_rpc", json=body)

    def reset_prefix_cache(self) -> None:
        # KV blocks computed by the old weights must not be reused; vLLM answers success=false while blocks
        # are held by running requests, which a paused server has none of
        answer = self._call("POST", "/reset_prefix_cache").json()
        if not answer.get("success", False):
            raise EndpointError("POST /reset_prefix_cache", 200, f"success=false: {answer!r}")

    def update_weight_version(self, version: str) -> None:
        self._call("POST", "/update_weight_version", json={"new_version": version})

    def weight_version(self) -> str | None:
        return self._call("GET", "/weight_info").json().get("weight_version")

    def load_lora(self, name: str, path: str) -> None:
        body = {"lora_name": name, "lora_path": path, "load_inplace": True}
        self._call("POST", "/v1/load_lora_adapter", json=body)

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        endpoint = f"{method} {path}"
        try:
            response = httpx.request(method, self.root + path, timeout=self.timeout, **kwargs)
        except httpx.TimeoutException:
            raise EndpointError(endpoint, None, f"no answer within {self.timeout:.0f}s") from None
        except httpx.TransportError as exc:
            raise EndpointError(endpoint, None, f"cannot connect ({type(exc).__name__})") from None
        if response.status_code >= 400:
            raise EndpointError(endpoint, response.status_code, response.text[:300])
        return response
