"""vf_tool_add: a verifiers (v1) taskset with a toolset, in verifiers' own style (as `vf-init --add-tool`
scaffolds one): add two numbers with the `add` tool. Reward `correct` (the final reply holds the sum); metric
`tool_calls` (how many tool results the run saw)."""

import re

import verifiers.v1 as vf

from vf_tool_add.tools import AddToolset

PAIRS = [(2, 3), (10, 7), (4, 4), (12, 30)]


class AddData(vf.TaskData):
    a: int
    b: int


class AddTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class AddTask(vf.Task[AddData, vf.State, AddTaskConfig]):
    @classmethod
    def toolsets(cls, config: AddTaskConfig) -> list[vf.Toolset]:
        return [AddToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        found = re.findall(r"-?\d+", trace.last_reply)
        return 1.0 if found and int(found[-1]) == self.data.a + self.data.b else 0.0

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))


class AddConfig(vf.TasksetConfig):
    task: AddTaskConfig = AddTaskConfig()


class AddTaskset(vf.Taskset[AddTask, AddConfig]):
    def load(self) -> list[AddTask]:
        return [
            AddTask(AddData(prompt=f"Use the add tool: what is {a} + {b}?", a=a, b=b), self.config.task)
            for a, b in PAIRS
        ]
