"""`--parallel replicate`'s gradient sum overlapped with the backward (`replicate.OverlappedSum`), on a CPU.

Two gloo ranks (subprocesses of this file, `worker`) train one step of the shipped model's shape (random weights,
Llama) with small buckets;
the test checks that the step equals one process training the whole batch, that the buckets started in order
and mostly while the last backward was still running (timestamps against the backward's return), in fp32 and
bf16-pure (the fp32 master path, the LM head's gradient through its sink), tied and untied heads. With CUDA graphs
(a recorder that runs the recording's Python and undoes its arithmetic, as a capture does): no collective inside a
recording, every bucket started behind the marks the last replay's recording put in. And the host side of a
many-rank step: each rank prepares only its own groups' samples.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

CASES = {  # name: (dtype, tied head, gradient checkpointing, groups in the batch)
    "fp32-tied": ("fp32", True, False, 6),
    "bf16pure-tied": ("bf16-pure", True, False, 6),
    "bf16pure-untied": ("bf16-pure", False, False, 6),
    "bf16pure-checkpointing": ("bf16-pure", True, True, 6),
    "fp32-one-group": ("fp32", True, False, 1),  # rank 1 trains nothing: it sums its zeros in the same order
    "bf16pure-graphs": ("bf16-pure", True, False, 6),  # micro-batches replayed (graphs.py), 2 steps
}
GRAPHS_STEPS = 2  # the second step replays shapes the first recorded
# The fp32 weights (masters) after one AdamW step of lr 1e-3, against one process: the gradient is the same sum in
# another order and AdamW's first step is about lr x sign(gradient), so a gradient near zero may move its weight
# by up to 2 x lr the other way. fp32: no weight differs by more than a tenth of a step. bf16-pure: each micro-batch's
# gradient is rounded to bf16 and the ranks' micro-batches hold other samples, so a few weights (~0.2%) flip; a
# bucket summed wrong (a rank missing, or summed twice) would flip about half of its weights and move the norm.
TOL = 1e-4
FLIPPED = {"fp32": 0.0, "bf16-pure": 0.005}
NORM = {"fp32": 1e-5, "bf16-pure": 1e-3}


def _groups(count: int = 6):
    from atropos_cli.types import ScoredGroup

    gen = torch.Generator().manual_seed(0)
    groups = []
    for g in range(count):
        lengths = torch.randint(12, 40, (4,), generator=gen).tolist()
        tokens = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in lengths]
        masks = [[-100] * 4 + t[4:] for t in tokens]
        groups.append(ScoredGroup(tokens=tokens, masks=masks, scores=[1.0, 0.0, float(g % 2), 0.5]))
    return groups


def _trainer(dtype: str, tied: bool, checkpointing: bool = False, dist=None, static: bool = False):
    from transformers import AutoConfig, AutoModelForCausalLM

    from atropos_cli.resources import resolve_model_path
    from atropos_cli.trainer.config import GRPOConfig
    from atropos_cli.trainer.step.grpo import GRPOTrainer

    cfg = AutoConfig.from_pretrained(resolve_model_path("atropos-tiny-arith"))  # the shipped shape, random weights
    cfg.tie_word_embeddings = tied
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # the same weights in every process (from_config's own init is not seeded here)
        for param in model.parameters():
            param.normal_(0.0, 0.05, generator=gen)
    config = GRPOConfig(
        out=tempfile.mkdtemp(prefix="overlap-"),
        device="cpu",
        dtype=dtype,
        lr=1e-3,
        max_len=64,
        # several micro-batches a rank: only the last one overlaps (static rows, for graphs: the narrow widths 128
        # and 256 are run and recorded ahead, where the run's first row is not one)
        micro_batch_tokens=512 if static else 128,
        parallel="replicate",
        gradient_checkpointing=checkpointing,
    )
    trainer = GRPOTrainer(config, model=model, dist=dist)
    if static:  # the CUDA layout (graphs need it), on this CPU through the dense varlen attention
        import dataclasses

        from atropos_cli.trainer.step.attention import use_varlen

        use_varlen(model)
        trainer.pack = "static"
        trainer.static_shape = dataclasses.replace(trainer.static_shape, exact=True, bucketed=True)
    return trainer


class CapturingRecorder:
    """What a CUDA capture does, on a CPU: the function's Python runs (hooks, marks), no collective may start
    (`dist.all_reduce` raises meanwhile), and its arithmetic is undone (a capture runs no kernel: the gradient
    buffers are restored). A replay runs the arithmetic again with the hooks finding nothing armed (a replay runs
    no Python)."""

    def __init__(self, reducer) -> None:
        self.reducer, self.recording, self.recordings = reducer, False, 0

    def record(self, fn):
        saved = [flat.clone() for flat in self.reducer.flats]
        self.recording = True
        try:
            fn()
        finally:
            self.recording = False
            for flat, old in zip(self.reducer.flats, saved, strict=True):
                flat.copy_(old)
        self.recordings += 1

        def replay():
            assert not self.reducer.armed, "a replay runs no hooks: nothing may be armed during it"
            return fn()

        return replay


def _with_graphs(trainer) -> CapturingRecorder:
    import torch.distributed as torch_dist

    from atropos_cli.trainer.scale import replicate
    from atropos_cli.trainer.step.batching import narrow_warmups
    from atropos_cli.trainer.step.graphs import MicroBatchGraphs

    reducer = trainer.precision.reducer
    recorder = CapturingRecorder(reducer)
    undo = trainer.precision.discard_pending
    ahead = functools.partial(narrow_warmups, shape=trainer.static_shape)  # as the trainer sets it up on CUDA
    trainer.graphs = MicroBatchGraphs(trainer._train_micro_batch, "cpu", recorder, undo, reducer, ahead)

    def all_reduce(*args, **kwargs):
        assert not recorder.recording, "a collective issued inside a recording"
        return torch_dist.all_reduce(*args, **kwargs)

    replicate.dist = type("Dist", (), {"all_reduce": staticmethod(all_reduce)})  # the module's `dist.all_reduce`
    return recorder


def _weights(trainer) -> dict[str, list[float]]:
    """The fp32 weights a step produced (the masters in bf16-pure), flattened."""
    p = trainer.precision
    return {str(i): t.detach().float().reshape(-1).tolist() for i, t in enumerate(p.optimized)}


def _started_in_last_backward(ends: list[tuple[list[float], int]], launches: list[float]) -> int | None:
    """Buckets of the last step started before the last Python backward returned: counted, not timed. None when
    no backward ran (this rank had no sample to train); 0 when the last backward was an earlier step's (a step
    whose last micro-batch was a graph replay)."""
    if not ends:
        return None
    seen, count = ends[-1]
    return count if seen is launches else 0


def worker(case: str, out: str) -> None:
    from atropos_cli.trainer.scale import replicate
    from atropos_cli.trainer.scale.distributed import init_from_env
    from atropos_cli.trainer.step import precision

    dtype, tied, checkpointing, count = CASES[case]
    replicate.BUCKET_BYTES = 64 * 1024  # many buckets on a tiny model
    precision.BUCKET = 4  # bf16-pure: gradients moved into the masters 4 at a time (a 0.5B model's 32: ~2 layers)
    dist = init_from_env("cpu", 60)
    graphs = case.endswith("graphs")
    trainer = _trainer(dtype, tied, checkpointing, dist, static=graphs)
    recorder = _with_graphs(trainer) if graphs else None
    # at each backward's end: the reducer's launch list then (arm() starts a new one each step) and its length
    backward_ends: list[tuple[list[float], int]] = []
    original = torch.Tensor.backward

    def backward(self, *args, **kwargs):
        original(self, *args, **kwargs)
        launches = trainer.precision.reducer.launch_times
        backward_ends.append((launches, len(launches)))

    torch.Tensor.backward = backward  # type: ignore[method-assign]
    for _ in range(GRAPHS_STEPS if graphs else 1):
        metrics = trainer.step(_groups(count))
    reducer = trainer.precision.reducer
    result = {
        "buckets": len(reducer.flats),
        "order": reducer.launch_order,
        "early": reducer.early,
        # None: this rank had no sample to train (its buckets all start in `finish`)
        "before_backward_end": _started_in_last_backward(backward_ends, reducer.launch_times),
        "grad_norm": metrics["grad_norm"],
        "weights": _weights(trainer),
        "graphs": None,
    }
    if recorder is not None:
        g = trainer.graphs
        result["graphs"] = {"recorded": recorder.recordings, "replayed": g.replayed, "eager": g.eager,
                            "warmups": g.warmups}  # fmt: skip
    Path(out, f"rank{dist.rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Every case's two ranks, all started at once (each case its own port)."""
    procs, outs = [], {}
    for case in CASES:
        out = tmp_path_factory.mktemp(case)
        port = _free_port()
        for rank in range(2):
            env = {
                **os.environ,
                "OMP_NUM_THREADS": "1",
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
            command = [sys.executable, __file__, case, str(out)]
            procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        outs[case] = out
    for proc in procs:
        stdout, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, stdout.decode()[-3000:]
    return outs


@pytest.mark.parametrize("case", list(CASES))
def test_overlapped_sum_trains_like_one_process(runs: dict[str, Path], case: str):
    dtype, tied, checkpointing, count = CASES[case]
    ranks = [json.loads((runs[case] / f"rank{r}.json").read_text()) for r in range(2)]
    graphs = case.endswith("graphs")
    one = _trainer(dtype, tied, checkpointing, static=graphs)
    for _ in range(GRAPHS_STEPS if graphs else 1):
        metrics = one.step(_groups(count))
    expected = _weights(one)
    assert ranks[0]["weights"] == ranks[1]["weights"]  # replicas stay identical
    diffs = [abs(a - b) for key in expected for a, b in zip(ranks[0]["weights"][key], expected[key], strict=True)]
    flipped = sum(d > TOL for d in diffs) / len(diffs)
    assert flipped <= FLIPPED[dtype], (flipped, max(diffs))
    assert abs(ranks[0]["grad_norm"] - metrics["grad_norm"]) < NORM[dtype] * metrics["grad_norm"]


@pytest.mark.parametrize("case", list(CASES))
def test_buckets_start_in_order_while_the_backward_runs(runs: dict[str, Path], case: str):
    for result in (json.loads((runs[case] / f"rank{r}.json").read_text()) for r in range(2)):
        assert result["buckets"] >= 4
        assert result["order"] == list(range(result["buckets"]))
        if result["graphs"] is not None:  # the last micro-batch was a replay: each bucket started behind its mark
            graphs = result["graphs"]
            assert graphs["eager"] == 1 and graphs["warmups"] >= 1 and graphs["replayed"] >= 2
            assert result["early"] == result["buckets"] and result["before_backward_end"] == 0
            continue
        # fp32: every bucket starts inside the backward (the embedding's, whose gradient comes last, as its last
        # node finishes). bf16-pure: gradients reach their masters BUCKET at a time, and a bucket holding a layer's
        # input norm (listed first in the layer, finished last) waits for the layer: half of these tiny buckets
        if result["before_backward_end"] is None:  # a rank that trained nothing
            assert CASES[case][3] == 1 and result["early"] == 0
            continue
        least = result["buckets"] if case.startswith("fp32") else result["buckets"] // 2
        assert result["before_backward_end"] >= least
        assert result["early"] >= result["before_backward_end"]


def test_each_rank_builds_only_its_groups_and_counts_the_whole_batch():
    """`prepare(keep=...)`: a rank's samples are exactly its groups' ones from the full preparation, and the
    counts (loss normaliser, metrics) are the whole batch's, whichever groups a rank keeps."""
    from atropos_cli.trainer.scale.distributed import assign_groups
    from atropos_cli.trainer.step.batching import prepare
    from atropos_cli.trainer.step.metrics import reward_metrics

    groups = _groups()
    groups[2].masks = [[-100] * len(t) for t in groups[2].tokens]  # trains nothing: counted, never kept
    groups[3].scores = [0.5] * 4  # no signal: dropped by dynamic sampling
    full = prepare(groups, True, True, 30)
    assert full.truncated > 0 and full.sequences == len(full.samples) == 16
    seen: list = []
    for rank in range(3):

        def keep(loads: dict[int, int], rank: int = rank) -> set[int]:
            assert sorted(loads) == [0, 1, 4, 5]  # the groups that train, with their tokens
            order = sorted(loads)
            return {order[i] for i in assign_groups([loads[g] for g in order], 3)[rank]}

        part = prepare(groups, True, True, 30, keep)
        assert reward_metrics(part) == reward_metrics(full)
        assert (part.sequences, part.trained_tokens) == (full.sequences, full.trained_tokens)
        assert full.trained_tokens == sum(s.num_trained for s in full.samples)
        seen += [(s.group, s.tokens, s.advantages) for s in part.samples]
    assert sorted(seen) == sorted((s.group, s.tokens, s.advantages) for s in full.samples)


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2])
