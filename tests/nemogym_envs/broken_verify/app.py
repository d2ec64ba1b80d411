"""A NeMo Gym resources server whose verify raises (the adapters' conformance battery: an env that fails
mid-rollout must give failure records, never a crash)."""

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)


class BrokenVerifyConfig(BaseResourcesServerConfig):
    pass


class BrokenVerifyServer(SimpleResourcesServer):
    ray_enabled = False
    config: BrokenVerifyConfig

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        raise ValueError("verify failed on purpose")


if __name__ == "__main__":
    BrokenVerifyServer.run_webserver()
