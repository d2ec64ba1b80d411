"""A verifiers (v1) taskset whose reward raises (the adapters' conformance battery: an env error is a failure
record, never a crash)."""

import verifiers.v1 as vf


class BrokenTask(vf.Task[vf.TaskData]):
    @vf.reward(weight=1.0)
    async def explodes(self, trace: vf.Trace) -> float:
        raise RuntimeError("the broken taskset's reward failed on purpose")


class BrokenTaskset(vf.Taskset[BrokenTask, vf.TasksetConfig]):
    def load(self) -> list[BrokenTask]:
        return [BrokenTask(vf.TaskData(prompt=f"What is {i} + 1?"), self.config.task) for i in range(4)]


__all__ = ["BrokenTaskset"]
