"""A NeMo Gym resources server written in its style (nemo-gym 0.7.0's SimpleResourcesServer), for the `nemogym:`
adapter's tests: each task asks a sum; the `add` tool adds two numbers for the session that called it; verify
rewards an answer that ends with the task's expected sum, and reports whether this session used the tool
(`reward_components`). Its state is per session (the session cookie NeMo Gym's middleware sets), so a client
that loses the cookie between seed, tool call and verify is caught.
"""

from fastapi import FastAPI, Request
from nemo_gym.base_resources_server import (
    BaseMultiRewardVerifyResponse,
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    SimpleResourcesServer,
)
from nemo_gym.server_utils import SESSION_ID_KEY
from pydantic import BaseModel, Field


class SumToolConfig(BaseResourcesServerConfig):
    pass


class SumSeedRequest(BaseSeedSessionRequest):
    expected: int


class AddRequest(BaseModel):
    a: int
    b: int


class AddResponse(BaseModel):
    sum: int


class SumVerifyRequest(BaseVerifyRequest):
    expected: int


class SumToolServer(SimpleResourcesServer):
    ray_enabled = False
    config: SumToolConfig
    seeded: dict[str, int] = Field(default_factory=dict)
    tool_uses: dict[str, int] = Field(default_factory=dict)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/add")(self.add)
        return app

    async def seed_session(self, request: Request, body: SumSeedRequest) -> BaseSeedSessionResponse:
        self.seeded[request.session[SESSION_ID_KEY]] = body.expected
        return BaseSeedSessionResponse()

    async def add(self, request: Request, body: AddRequest) -> AddResponse:
        session = request.session[SESSION_ID_KEY]
        if session not in self.seeded:
            raise ValueError("add called outside a seeded session")
        self.tool_uses[session] = self.tool_uses.get(session, 0) + 1
        return AddResponse(sum=body.a + body.b)

    async def verify(self, request: Request, body: SumVerifyRequest) -> BaseMultiRewardVerifyResponse:
        session = request.session[SESSION_ID_KEY]
        if self.seeded.get(session) != body.expected:
            raise ValueError("verify called outside the session seeded with this task")
        texts = [
            part.text
            for item in body.response.output
            if item.type == "message"
            for part in item.content
            if part.type == "output_text"
        ]
        answered = float(bool(texts) and texts[-1].strip().endswith(str(body.expected)))
        used_tool = float(self.tool_uses.get(session, 0) > 0)
        return BaseMultiRewardVerifyResponse(
            **body.model_dump(), reward=answered, reward_components={"answered": answered, "used_tool": used_tool}
        )


if __name__ == "__main__":
    SumToolServer.run_webserver()
