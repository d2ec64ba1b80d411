"""One item stream across ranks: every data-parallel rank and every engine rank of `atropos train` takes its
share of each step's items of ONE stream, so no item is trained twice.

The unit tests drive `ItemStream` over real envs (a SimpleEnv, an Atropos env file that shuffles with the
unseeded `random` and keeps its own counter, the gym adapter's items), as W ranks would; the end-to-end tests
run the real CLI under torchrun on gloo (2 and 3 data-parallel ranks, 1 trainer + 2 engines) and read the
trained rollouts back: no item twice within a step or across steps, and together the stream's first items.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from atropos_cli.config import EnvConfig, ServerConfig
from atropos_cli.env.base import BaseEnv, SimpleEnv
from atropos_cli.env.item_digest import item_digest

pytest.importorskip("torch")

from atropos_cli.trainer.data.item_stream import ItemStream, StreamCheck, share  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COUNT_ENV = ROOT / "examples" / "count_env.py"  # items {"id": i, "q": str(i)}, i = 0, 1, 2, ... in order
ATROPOS = [sys.executable, "-m", "atropos_cli"]

ATROPOS_ENV = '''
"""In the style of Atropos' env files: rows shuffled in setup() by the unseeded `random`, its own counter,
items without ids (tuples); the rollouts use `random` too."""

import random

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig


class CounterEnv(BaseEnv):
    name = "counter"

    @classmethod
    def config_init(cls):
        return BaseEnvConfig(use_wandb=False, tokenizer_name="none"), APIServerConfig(model_name="m", base_url="http://127.0.0.1:9/v1")

    async def setup(self):
        self.rows = [(f"Say {i}", i) for i in range(50)]
        random.shuffle(self.rows)
        self.iter = 0

    async def get_next_item(self):
        self.iter += 1
        return self.rows[(self.iter - 1) % len(self.rows)]
'''


class Ordered(SimpleEnv):
    name = "ordered"

    def items(self, split):
        return ({"id": i} for i in range(23))  # ends: the last step's block is short


class Unseeded(BaseEnv):
    """Draws from a generator seeded by the OS: every rank gets other items."""

    async def setup(self):
        self.own = random.Random()

    async def get_next_item(self):
        return {"id": self.own.randrange(10**9)}


def _walk(make_env, world: int, n: int, steps: int) -> list[list[list[tuple[int, object]]]]:
    """[step][rank] -> that rank's (stream index, item) of the step, as `world` ranks draw them; between blocks
    each rank uses `random` its own number of times, as rollouts would."""
    ranks = []
    for rank in range(world):
        stream = ItemStream(
            make_env(), seed=7, rank=rank, world=world, on_exhausted="stop"
        )  # the end of the stream, as is
        asyncio.run(stream.setup())
        taken = []
        for _ in range(steps):
            block = asyncio.run(stream.next_block(n))
            taken.append(block.taken() if block is not None else None)
            for _ in range(rank * 3 + 1):
                random.random()
        ranks.append(taken)
    return [[ranks[r][s] for r in range(world)] for s in range(steps)]


def _atropos_env(tmp_path: Path):
    from atropos_cli.env.registry import resolve_env

    path = tmp_path / "counter_env.py"
    path.write_text(ATROPOS_ENV)
    cls = resolve_env(str(path))
    return lambda: cls.build(cls.config_init()[0], [ServerConfig(model_name="m", base_url="http://127.0.0.1:9/v1")])


def test_a_blocks_shares_are_contiguous_disjoint_and_balanced():
    for world in (1, 2, 3, 4):
        for n in range(13):
            shares = [share(n, world, rank) for rank in range(world)]
            assert [i for s in shares for i in s] == list(range(n))  # in rank order, the block in stream order
            assert max(map(len, shares)) - min(map(len, shares)) <= 1
            assert [len(s) for s in shares] == sorted((len(s) for s in shares), reverse=True)


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_split_each_step_of_one_stream(world: int):
    one = _walk(lambda: Ordered(EnvConfig(), None), 1, 5, 6)
    many = _walk(lambda: Ordered(EnvConfig(), None), world, 5, 6)
    for step, (alone, ranks) in enumerate(zip(one, many, strict=True)):
        if alone == [None]:  # the stream ended (23 items: 4 full steps and one of 3): on every rank at once
            assert ranks == [None] * world, step
            continue
        assert [pair for taken in ranks for pair in taken] == alone[0], step
    drawn = [index for step in many if step[0] is not None for taken in step for index, _ in taken]
    assert drawn == list(range(23))


def test_an_atropos_env_file_shuffling_with_random_gives_every_rank_the_same_stream(tmp_path: Path):
    """Its shuffle and counter advance alike on every rank: the stream's `random` is seeded from the env seed
    and kept apart from the rollouts' use of `random`."""
    make = _atropos_env(tmp_path)
    one = _walk(make, 1, 4, 5)
    for world in (2, 3):
        many = _walk(make, world, 4, 5)
        for alone, ranks in zip(one, many, strict=True):
            assert [pair for taken in ranks for pair in taken] == alone[0]
    items = [item for step in one for _, item in step[0]]
    assert len(set(items)) == len(items) == 20


def test_the_gym_adapters_items_partition():
    pytest.importorskip("gymnasium")
    from atropos_cli.env.registry import resolve_env

    cls = resolve_env("gym:CartPole-v1")  # its items are (id, seed) pairs; no episode is played here
    make = lambda: cls(cls.env_config_cls(seed=3), None)  # noqa: E731
    one, two = _walk(make, 1, 3, 3), _walk(make, 2, 3, 3)
    for alone, ranks in zip(one, two, strict=True):
        assert [pair for taken in ranks for pair in taken] == alone[0]


def test_ranks_that_draw_different_items_are_reported_once():
    marks = []
    for rank in range(2):
        stream = ItemStream(Unseeded(EnvConfig(), None), seed=7, rank=rank, world=2)
        asyncio.run(stream.setup())
        blocks = [asyncio.run(stream.next_block(4)) for _ in range(2)]
        marks.append([(b.span, b.digest) for b in blocks])
    check = StreamCheck()
    first = check.warning([marks[0][0], marks[1][0]])
    assert first is not None and "items 0-3" in first and "self.config.seed" in first
    assert check.warning([marks[0][1], marks[1][1]]) is None and check.diverged == 2
    same = [ItemStream(Ordered(EnvConfig(), None), seed=7, rank=r, world=2) for r in range(2)]
    for stream in same:
        asyncio.run(stream.setup())
    blocks = [asyncio.run(stream.next_block(4)) for stream in same]
    assert StreamCheck().warning([(b.span, b.digest) for b in blocks]) is None


def test_an_items_digest_is_the_same_in_every_process():
    """Sets and string hashes change order between processes (PYTHONHASHSEED); the digest does not."""
    item = (frozenset({"role": "user", "content": "hi"}.items()), {"b": {1, 2, "x"}, "a": b"\x00y", "f": 0.5})
    code = (
        "from atropos_cli.env.item_digest import item_digest\n"
        "print(item_digest((frozenset({'role': 'user', 'content': 'hi'}.items()), "
        "{'b': {1, 2, 'x'}, 'a': b'\\x00y', 'f': 0.5})))"
    )
    seen = {
        subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True
        ).stdout.strip()
        for seed in ("1", "2", "3")
    }
    assert seen == {item_digest(item)}
    assert item_digest({"id": 1}) != item_digest({"id": 2}) and item_digest([1]) != item_digest([1.5])
    assert item_digest(object()) == item_digest(object())  # a repr's memory address is left out


def _train(out: Path, *flags: str) -> None:
    args = ["train", str(COUNT_ENV), "--out", str(out), "--steps", "3", "--groups-per-step", "5"]
    args += ["--env.group_size", "2", "--env.max_token_length", "4", "--save-rollouts", "--save-every", "0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([*ATROPOS, *args, *flags], capture_output=True, text=True, timeout=400, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ranks drew different" not in result.stdout + result.stderr


def _trained(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "trained_rollouts.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "flags",
    [["--nproc-per-node", "2"], ["--nproc-per-node", "3"], ["--nproc-per-node", "3", "--inference-gpus", "2"]],
    ids=["2 ranks", "3 ranks", "1 trainer + 2 engines"],
)
def test_no_item_is_trained_twice_across_ranks(tmp_path: Path, flags: list[str]):
    """5 groups a step (shares of 3+2 and 2+2+1) for 3 steps: the 15 groups are items 0..14, each once, each
    step's in stream order; every group carries its item's index and digest."""
    _train(tmp_path / "run", *flags)
    groups = _trained(tmp_path / "run")
    ids = [int(g["meta"]["item_id"]) for g in groups]
    assert Counter(ids).most_common(1)[0][1] == 1, Counter(ids)
    assert ids == list(range(15))  # the stream's first 15 items: steps 1, 2, 3 take 0-4, 5-9, 10-14
    assert [g["trained_step"] for g in groups] == [s for s in (1, 2, 3) for _ in range(5)]
    assert [g["meta"]["index"] for g in groups] == ids
    assert [g["meta"]["item_digest"] for g in groups] == [item_digest({"id": i, "q": str(i)}) for i in ids]


UNSEEDED_ENV = """
import random

from atropos_cli.env.base import SimpleEnv


class Unseeded(SimpleEnv):
    name = "unseeded"

    def items(self, split):
        own = random.Random()  # seeded by the OS: every rank draws other items
        while True:
            yield {"id": own.randrange(10**9)}

    def prompt(self, item):
        return "Say " + str(item["id"])

    def reward(self, completion, item):
        return float(len(completion) % 2)
"""

FINITE_ENV = """
from atropos_cli.env.base import SimpleEnv


class Finite(SimpleEnv):
    name = "finite"

    def items(self, split):
        return ({"id": i} for i in range(7))

    def prompt(self, item):
        return "Say " + str(item["id"])

    def reward(self, completion, item):
        return float(len(completion) % 2)
"""


def _run_env(tmp_path: Path, source: str, *flags: str) -> subprocess.CompletedProcess:
    path = tmp_path / "env.py"
    path.write_text(source)
    args = ["train", str(path), "--out", str(tmp_path / "run"), "--groups-per-step", "5", "--env.group_size", "2"]
    args += ["--env.max_token_length", "4", "--save-rollouts", "--save-every", "0", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([*ATROPOS, *args], capture_output=True, text=True, timeout=400, env=env)


def test_ranks_drawing_different_items_print_one_warning(tmp_path: Path):
    result = _run_env(tmp_path, UNSEEDED_ENV, "--steps", "2", "--nproc-per-node", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert output.count("warning: the ranks drew different items 0-4 of the env's stream") == 1, output
    assert "ranks drew different items 5-9" not in output  # reported once


def test_a_stream_that_ends_ends_every_engine_at_the_same_step(tmp_path: Path):
    """7 items, 5 a step, 2 engines, --on-exhausted stop: step 1 takes items 0-4, step 2 items 5-6 (one per engine),
    then the run ends."""
    result = _run_env(
        tmp_path, FINITE_ENV, "--steps", "5", "--nproc-per-node", "3", "--inference-gpus", "2", "--on-exhausted", "stop"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    groups = _trained(tmp_path / "run")
    assert [int(g["meta"]["item_id"]) for g in groups] == list(range(7))
    assert [g["trained_step"] for g in groups] == [1] * 5 + [2] * 2


def test_every_rank_starts_the_items_over_at_the_same_item():
    """--on-exhausted cycle (the default): when the env's 23 items run out, every rank restarts them at once,
    so the epochs' blocks stay one stream split across ranks."""
    events: list[str] = []
    streams = [
        ItemStream(Ordered(EnvConfig(), None), seed=7, rank=r, world=2, on_event=events.append) for r in range(2)
    ]
    for stream in streams:
        asyncio.run(stream.setup())
    for _ in range(10):  # 50 items: two epochs and a bit
        blocks = [asyncio.run(stream.next_block(5)) for stream in streams]
        assert blocks[0] is not None and blocks[0].digest == blocks[1].digest
    assert [s.epoch for s in streams] == [3, 3] and [s.epoch_size for s in streams] == [23, 23]
    assert events.count("the env's 23 items ran out: starting epoch 2") == 2  # once per rank
