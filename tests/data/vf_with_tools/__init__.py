"""A verifiers (v1) taskset whose task has a toolset (MCP tools): the vf: adapter refuses it before the model
loads (tools are not supported)."""

import verifiers.v1 as vf


class EchoToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "echo"

    @vf.tool
    def echo(self, text: str) -> str:
        """Return the given text unchanged."""
        return text


class ToolTask(vf.Task[vf.TaskData]):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [EchoToolset(vf.ToolsetConfig())]

    @vf.reward
    async def done(self, trace: vf.Trace) -> float:
        return 1.0


class ToolTaskset(vf.Taskset[ToolTask, vf.TasksetConfig]):
    def load(self) -> list[ToolTask]:
        return [ToolTask(vf.TaskData(prompt="Echo hello"), self.config.task)]


__all__ = ["ToolTaskset"]
