"""vf_arithmetic: a verifiers (v1) taskset in verifiers' own style (as `vf-init` scaffolds one): integer
questions, a `correct` reward and a `bare_number` metric. Run it with `atropos process vf:vf_arithmetic`
(PYTHONPATH=examples/verifiers), or with verifiers' own `vf-eval vf_arithmetic`."""

import random
import re

import verifiers.v1 as vf

_INT = re.compile(r"-?\d+")


class ArithmeticData(vf.TaskData):
    """One question and its answer."""

    answer: int


class ArithmeticTask(vf.Task[ArithmeticData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        found = _INT.findall(trace.last_reply)
        return 1.0 if found and int(found[-1]) == self.data.answer else 0.0

    @vf.metric
    async def bare_number(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply.strip().lstrip("-").isdigit() else 0.0


class ArithmeticConfig(vf.TasksetConfig):
    num_tasks: int = 50
    """How many questions to build."""
    max_operand: int = 30
    """Operands are drawn from 0..max_operand."""


class ArithmeticTaskset(vf.Taskset[ArithmeticTask, ArithmeticConfig]):
    def load(self) -> list[ArithmeticTask]:
        rng = random.Random(0)
        tasks = []
        for _ in range(self.config.num_tasks):
            a, b = rng.randint(0, self.config.max_operand), rng.randint(0, self.config.max_operand)
            data = ArithmeticData(prompt=f"What is {a} + {b}?", answer=a + b)
            tasks.append(ArithmeticTask(data, self.config.task))
        return tasks
