"""Many-GPU GRPO steps (FSDP2 through torchrun): tokens/s per GPU at 1, 2 and 4 GPUs, MFU and peak memory.

Weak scaling, as the issue asks: every GPU gets 64 sequences a step (lengths uniform in 128-1024, new lengths
every step, groups of 8; the same batches as benchmarks/bench_trainer.py's mixed rows), so a 4-GPU step
trains 256 sequences. Rows (each a fresh torchrun launch, all in one run on one machine):

- `plain`: the one-process trainer (no torchrun, no FSDP; bf16 weights + fp32 master), the 1-GPU reference;
- `SHAPE:N`: N ranks at the trainer's defaults (`--parallel auto`: small models replicate, the rest shard with
  FSDP2); `:fsdp` or `:replicate` forces one (FSDP2: bf16 compute, fp32 sharded master weights; replicate: the
  one-process trainer on every rank, gradients summed once a step, `trainer/scale/replicate.py`);
- larger shapes (Qwen2.5-1.5B/3B/7B, random weights) at 4 GPUs, full fine-tuning and LoRA r=16;
- any published shape of `atropos_cli.families` (`Llama-3.1-8B:4`, `Qwen3-30B-A3B:4:lora16`, `gpt-oss-20b:4:lora16`)
  or a family's tiny shape by the family's name (`qwen3_moe:2:lora4`, the CPU smoke test of an MoE row).

Rows of many ranks build the model on the meta device and the trainer fills each rank's shards at random
(`trainer/scale/meta_init.py`): no rank ever holds the whole model, so a 30B MoE's 122 GB of fp32 weights are
never built on one GPU.

Weak-scaling efficiency = (tokens/s per GPU at N) / (tokens/s of the `plain` 1-GPU row). MFU counts model
FLOPs only, as bench_trainer.py does (6 x matmul params + 12 x layers x hidden x seq per token, at the
token-weighted length), against 989 TFLOP/s per GPU (H100 dense bf16).

    python benchmarks/bench_fsdp.py --rows plain,0.5b:1,0.5b:2,0.5b:4 --out results.md   # the driver
    python benchmarks/bench_fsdp.py --tiny --device cpu --rows plain,tiny:2,qwen3_moe:2:lora4 --steps 1  # smoke (gloo)

The driver launches `python -m torch.distributed.run --standalone --nproc-per-node N bench_fsdp.py --worker
...` per row; each worker prints one JSON line that the driver turns into a table row.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

SHAPES = {  # Qwen2.5 configs (hidden, intermediate, layers, heads, kv heads, vocab, tied)
    "tiny": (64, 128, 2, 4, 2, 512, True),
    "0.5b": (896, 4864, 24, 14, 2, 151936, True),
    "1.5b": (1536, 8960, 28, 12, 2, 151936, True),
    "3b": (2048, 11008, 36, 16, 2, 151936, True),
    "7b": (3584, 18944, 28, 28, 4, 152064, False),
}


def model_config(shape: str):
    """A Qwen2.5 shape of SHAPES, or a published shape of `atropos_cli.families` (Llama-3.1-8B, Qwen3-8B, ...)."""
    if shape in SHAPES:
        return qwen(shape)
    from atropos_cli.families import config_for

    return config_for(shape)


def qwen(shape: str):
    from transformers import Qwen2Config

    hidden, inter, layers, heads, kv, vocab, tied = SHAPES[shape]
    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tied,
    )


def worker(args) -> None:
    import torch
    from bench_trainer import graphs_compiled, make_groups
    from transformers import AutoModelForCausalLM

    import atropos_cli.trainer.scale.fsdp as fsdp
    from atropos_cli.trainer.config import GRPOConfig
    from atropos_cli.trainer.scale import meta_init
    from atropos_cli.trainer.scale.distributed import init_from_env, world_from_env
    from atropos_cli.trainer.step.grpo import GRPOTrainer

    # r: layers keep their gathered weights at any size; o: replicas with CUDA graphs start their gradient sum
    # after the step's last replay (not behind its marks)
    knobs = set(filter(None, args.knobs.split("+")))
    fsdp.RESHARD_LAYERS = False if "r" in knobs else None
    rank, world = world_from_env()
    dist = init_from_env(args.device, 1800) if not args.plain else None
    device = dist.device if dist is not None else args.device
    node = bind_near_gpu(device, args.near_gpu)
    cfg = model_config(args.shape)
    if args.cap_gib and device.startswith("cuda"):  # an 80 GB card's budget on a larger one: defaults follow it
        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index  # a plain row's "cuda"
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gib * 2**30 / total), index)
    torch.manual_seed(0)
    attention = {"attn_implementation": "sdpa"} if args.shape in SHAPES else {}  # a family: its own default
    if dist is not None:  # on the meta device: the trainer shards it, each rank draws only its shards (meta_init.py)
        model = meta_init.empty_from_config(cfg, **attention)
    else:
        with torch.device(device):  # random weights made on the GPU itself (a 7B fp32 model in seconds)
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, **attention)
    from atropos_cli.trainer.step.router import router_for

    router = router_for(cfg)  # MoE: a token passes through top_k of the experts (FLOPs of the active ones)
    active = router.top_k / router.experts if router is not None else 1.0
    matmul_params = sum(
        p.numel() * (active if "experts" in n else 1.0)
        for n, p in model.named_parameters()
        if p.dim() >= 2 and "embed" not in n
    )
    if cfg.tie_word_embeddings:
        matmul_params += cfg.vocab_size * cfg.hidden_size
    config = GRPOConfig(
        out=tempfile.mkdtemp(prefix="bench-fsdp-"),
        device=device,
        lr=1e-6,
        max_len=args.seq_len + 1,
        micro_batch_tokens=args.micro_batch_tokens,
        gradient_checkpointing=args.gc,
        lora_r=args.lora_r,
        grad_sync=args.grad_sync,
        compile=False if args.no_compile else None,
        cuda_graphs=False if args.no_cuda_graphs else None,
        parallel=args.parallel,
    )
    trainer = GRPOTrainer(config, model=model, dist=dist)
    if "o" in knobs and trainer.graphs is not None:
        trainer.graphs.reducer = None
    seqs = args.seqs * world
    batches = [
        make_groups(seqs, args.seq_len, 8, cfg.vocab_size, seed=s, min_len=args.min_len)
        for s in range(args.warmup + args.steps)
    ]
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    started = time.perf_counter()
    for batch in batches[: args.warmup]:
        trainer.step(batch)
    sync()
    first = time.perf_counter() - started
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    retries = torch.cuda.memory_stats().get("num_alloc_retries", 0) if device.startswith("cuda") else 0
    probe = Probe(trainer, sync, node) if args.detail else None
    graphs = graphs_compiled()
    started = time.perf_counter()
    losses = []
    for batch in batches[args.warmup :]:
        if probe is not None:
            probe.begin()
        metrics = trainer.step(batch)
        losses.append(metrics["loss"])
        moe = {k: round(v, 4) for k, v in metrics.items() if k.startswith("moe_")}
        if probe is not None:
            probe.end()
    sync()
    elapsed = time.perf_counter() - started
    recompiles = graphs_compiled() - graphs  # graphs compiled inside the timed steps
    timed = batches[args.warmup :]
    if args.profile:  # one more step under the profiler on every rank (they meet in collectives): rank 0 prints
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            trainer.step(timed[-1])
            sync()
    if args.profile and rank == 0:
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25), flush=True)
    lengths = [len(t) for b in timed for g in b for t in g.tokens]
    tokens = sum(lengths)
    weighted = sum(n * n for n in lengths) / tokens
    fpt = 6 * matmul_params + 12 * cfg.num_hidden_layers * cfg.hidden_size * weighted
    cuda = device.startswith("cuda")
    # peak allocated memory; the caching allocator near the card's limit: reserved memory, and retries (a failed
    # cudaMalloc: every cached block freed, the device synchronised, the allocation tried again) in the timed steps
    memory = (
        (torch.cuda.max_memory_allocated() / 2**30, torch.cuda.max_memory_reserved() / 2**30,
         torch.cuda.memory_stats().get("num_alloc_retries", 0) - retries)
        if cuda else (float("nan"), float("nan"), 0)
    )  # fmt: skip
    peaks, reserved_all, retries_all = zip(*(dist.gather(memory) if dist is not None else [memory]), strict=True)
    g = trainer.graphs  # micro-batches recorded / replayed / run eagerly, failed recordings: over the whole run
    mine = (g.recorded, g.replayed, g.eager, g.failures) if g is not None else (0, 0, 0, 0)
    counts = [sum(c) for c in zip(*(dist.gather(mine) if dist is not None else [mine]), strict=True)]
    if rank == 0:
        per_gpu = tokens / elapsed / world
        row = {
            "world": world,
            "tokens_per_s_per_gpu": per_gpu,
            "mfu": per_gpu * fpt / 989.4e12,
            "peak_gib": max(peaks),
            "reserved_gib": max(reserved_all),
            "alloc_retries": sum(retries_all),
            "s_per_step": elapsed / len(timed),
            "warmup_s": first,
            "recompiles": recompiles,
            "graphs": "/".join(map(str, counts)) if g is not None else "off",
            "params_b": sum(p.numel() for p in model.parameters()) / 1e9,
            "loss": losses[-1],
            **moe,
            "how": f"{config.parallel if dist is not None else 'one process'}, {config.micro_batch_tokens // 1024}k"
            + (f", grad sync {config.grad_sync}" if dist is not None and config.parallel == "fsdp" else "")
            + (", NUMA-bound" if args.near_gpu else ""),
        }
    details = (dist.gather(probe.steps) if dist is not None else [probe.steps]) if probe is not None else None
    if rank == 0:
        if details is not None:
            row["detail"] = details
        print("ROW " + json.dumps(row), flush=True)
    if dist is not None:
        dist.close()


def bind_near_gpu(device: str, bind: bool) -> str:
    """The NUMA node of this rank's GPU (sysfs, from its PCI address), and with `bind` (row flag `:numa`) every
    thread of this process confined to that node's CPUs (a host-bound step launches from there); '' on a CPU."""
    import torch

    if not device.startswith("cuda"):
        return ""
    props = torch.cuda.get_device_properties(device)
    try:  # (the PCI fields are in torch >= 2.9's device properties)
        address = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        node = max(int(Path(f"/sys/bus/pci/devices/{address}/numa_node").read_text()), 0)
        spans = Path(f"/sys/devices/system/node/node{node}/cpulist").read_text().strip().split(",")
    except (AttributeError, OSError, ValueError) as exc:
        return f"unknown ({exc.__class__.__name__})"
    near = set()
    for span in spans:
        low, _, high = span.partition("-")
        near.update(range(int(low), int(high or low) + 1))
    cpus = near & os.sched_getaffinity(0)
    if bind and cpus:
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(tid), cpus)
    return f"{node}: {len(os.sched_getaffinity(0))}"


class Probe:
    """`:detail` rows: what each timed step cost this rank: wall time, its micro-batches and tokens, host time in
    `prepare` (its groups chosen, its samples built, the batch counted) and collation, the GPU's backlog when the
    step reached the optimizer, the time then blocked on the gradient sum, gen-2 garbage collections.
    CUDA-synchronised around the optimizer step, so only here."""

    def __init__(self, trainer, sync, node: str) -> None:
        import gc

        from atropos_cli.trainer.step import batching, grpo

        self.node = node
        self.steps: list[dict] = []
        self.sync, self.trainer = sync, trainer
        self.cur: dict = {}
        host = ("prepare_ms", grpo, "prepare"), ("prepare_ms", grpo, "reward_metrics")
        collate = ("collate_ms", trainer, "_micro_batches"), ("collate_ms", batching, "static_micro_batch")
        for key, owner, name in (*host, *collate):
            setattr(owner, name, self._timed(key, getattr(owner, name)))
        batches = trainer._micro_batches
        trainer._micro_batches = lambda samples: self._count(batches(samples))
        step = trainer.precision.step
        trainer.precision.step = lambda clip: self._gpu_tail(step, clip)
        reducer = getattr(trainer.precision, "reducer", None)
        if reducer is not None:
            finish = reducer.finish
            reducer.finish = lambda: self._reduce(finish, reducer)
        gc.callbacks.append(self._gc)
        self._gc_started = 0.0

    def _timed(self, key, fn):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cur[key] = self.cur.get(key, 0.0) + (time.perf_counter() - t) * 1e3

        return timed

    def _count(self, batches):
        self.cur["micro_batches"] = self.cur.get("micro_batches", 0) + len(batches)
        widths = batches.widths() if hasattr(batches, "widths") else [mb.input_ids.numel() for mb in batches]
        self.cur["my_tokens"] = self.cur.get("my_tokens", 0) + sum(widths)  # (static rows: not collated here)
        return batches

    def _gpu_tail(self, step, clip):
        t = time.perf_counter()
        self.sync()  # the GPU finishing the backward the host already queued
        self.cur["gpu_tail_ms"] = (time.perf_counter() - t) * 1e3
        return step(clip)

    def _reduce(self, finish, reducer):
        t = time.perf_counter()
        finish()
        self.sync()
        self.cur["reduce_wait_ms"] = (time.perf_counter() - t) * 1e3
        self.cur["buckets"] = f"{reducer.early}/{len(reducer.flats)}"

    def _gc(self, phase, info) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.cur["gc2"] = self.cur.get("gc2", 0) + 1
            self.cur["gc2_ms"] = self.cur.get("gc2_ms", 0.0) + (time.perf_counter() - self._gc_started) * 1e3

    def begin(self) -> None:
        self.cur = {"started": time.perf_counter(), "node": self.node}

    def end(self) -> None:
        self.cur["wall_s"] = time.perf_counter() - self.cur.pop("started")
        self.steps.append(self.cur)


def detail_lines(spec: str, detail: list[list[dict]]) -> list[str]:
    """One table line per rank and timed step of a `:detail` row."""
    lines = []
    for rank, steps in enumerate(detail):
        for i, d in enumerate(steps):
            gc2 = f"{d.get('gc2', 0)} / {d.get('gc2_ms', 0.0):.0f}"
            lines.append(
                f"| {spec} | {rank} | {d.get('node', '')} | {i} | {d['wall_s']:.3f} | {d.get('micro_batches', 0)} "
                f"| {d.get('my_tokens', 0):,} "
                f"| {d.get('prepare_ms', 0.0):.1f} | {d.get('collate_ms', 0.0):.1f} | {d.get('gpu_tail_ms', 0.0):.1f} "
                f"| {d.get('reduce_wait_ms', float('nan')):.1f} | {d.get('buckets', '')} | {gc2} |"
            )
    return lines


DETAIL_HEAD = [
    "",
    "Per rank and timed step (`:detail` rows): the NUMA node of the rank's GPU and how many CPUs the rank may run on "
    "(`:numa` rows: only that node's); wall s; this rank's micro-batches and model tokens (filler included); "
    "host ms in prepare + reward_metrics and in choosing/collating its micro-batches; GPU tail ms (the GPU finishing "
    "queued work when the host reached the optimizer); ms blocked on the gradient sum after that (replicate); "
    "buckets started during the backward / all; gen-2 GC count / ms.",
    "",
    "| row | rank | GPU's NUMA node: CPUs | step | wall s | micro-batches | tokens | prepare ms | collate ms "
    "| GPU tail ms | reduce wait ms | buckets early/all | gen-2 GC n / ms |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
]


def row_shape(spec: str, plain_shape: str) -> str:
    """The model shape of a row: 'SHAPE:N...' -> SHAPE; 'plain' -> the plain shape; 'plain:SHAPE...' -> SHAPE."""
    parts = spec.split(":")
    if parts[0] != "plain":
        return parts[0]
    return parts[1] if len(parts) > 1 and _is_shape(parts[1]) else plain_shape


def _is_shape(name: str) -> bool:
    """A Qwen2.5 shape of SHAPES or a published shape of atropos_cli.families (not a row flag)."""
    from atropos_cli.families import shape_names

    return name in SHAPES or name in shape_names()


def run_row(spec: str, args) -> dict:
    """One row: 'plain[:SHAPE]' or 'SHAPE:N[:lora16][:gc][:micro][:fsdp|:replicate][:detail][:numa]' (either
    with [:mbtN][:prof][:nocompile][:nographs][:exp]: exp = the allocator's expandable segments; nographs = the
    eager step, the one-process default before CUDA graphs, which many ranks still run) -> its measurements (or
    the failure)."""
    parts = spec.split(":")
    shape = row_shape(spec, "tiny" if args.tiny else "0.5b")
    n = 1 if parts[0] == "plain" else int(parts[1])
    if parts[0] == "plain" and len(parts) > 1 and _is_shape(parts[1]):  # plain:1.5b: the shape is no flag
        parts = [parts[0], *parts[2:]]
    alloc_conf = None  # `exp`: the caching allocator's expandable segments (no fragmentation near the limit)
    extra = ["--shape", shape, "--steps", str(args.steps), "--warmup", str(args.warmup), "--device", args.device]
    extra += ["--seqs", str(args.seqs), "--seq-len", str(args.seq_len), "--min-len", str(args.min_len)]
    if args.cap_gib:
        extra += ["--cap-gib", str(args.cap_gib)]
    for flag in parts[1:] if parts[0] == "plain" else parts[2:]:
        if flag.startswith("lora"):
            extra += ["--lora-r", flag[4:]]
        elif flag == "gc":
            extra += ["--gc"]
        elif flag == "micro":
            extra += ["--grad-sync", "micro-batch"]
        elif flag.startswith("mbt"):
            extra += ["--micro-batch-tokens", flag[3:]]
        elif flag.startswith("k="):
            extra += ["--knobs", flag[2:]]
        elif flag == "prof":
            extra += ["--profile"]
        elif flag == "detail":
            extra += ["--detail"]
        elif flag == "numa":
            extra += ["--near-gpu"]
        elif flag == "nocompile":
            extra += ["--no-compile"]
        elif flag == "nographs":
            extra += ["--no-cuda-graphs"]
        elif flag == "exp":
            alloc_conf = "expandable_segments:True"
        elif flag in ("fsdp", "replicate"):
            extra += ["--parallel", flag]
    if args.no_compile:
        extra.append("--no-compile")
    script = [str(Path(__file__).resolve()), "--worker", *extra]
    if parts[0] == "plain":
        command = [sys.executable, *script, "--plain"]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", *script]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "4")}
    if args.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = args.gpu
    if alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    try:
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.row_timeout)
        stdout, stderr, late = result.stdout, result.stderr, False
    except subprocess.TimeoutExpired as exc:  # the row's output so far is kept; the other rows still run
        stdout, stderr, late = _text(exc.stdout), _text(exc.stderr), True
    if args.logs:  # every row's whole output, kept (a failed row's cause is often above torchrun's summary)
        Path(args.logs).mkdir(parents=True, exist_ok=True)
        Path(args.logs, re.sub(r"[^\w.-]", "_", spec) + ".log").write_text(stdout + "\n--- stderr ---\n" + stderr)
    if "--profile" in extra:
        print(stdout, flush=True)
    for line in stdout.splitlines():
        if line.startswith("ROW "):
            return {"spec": spec, **json.loads(line[4:])}
    if late:
        return {"spec": spec, "error": f"timed out after {args.row_timeout:.0f} s (--row-timeout)"}
    text = (stderr or "") + (stdout or "")
    # the first exception line a rank printed (torchrun's own summary comes last and says nothing)
    cause = next(
        (ln.strip() for ln in text.splitlines() if re.match(r"\s*(\[rank\d+\]:?\s*)?\w+(Error|Exception)\b", ln)), ""
    )
    tail = text.strip().splitlines()[-3:]
    return {"spec": spec, "error": (cause or " / ".join(tail))[-300:]}


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--plain", action="store_true", help="worker: one process, no FSDP")
    parser.add_argument("--shape", default="0.5b", help="a Qwen2.5 shape (tiny, 0.5b, ...) or a published one")
    parser.add_argument("--cap-gib", type=float, default=None, help="each process's GPU memory cap (e.g. 80)")
    parser.add_argument("--tiny", action="store_true", help="driver: the tiny shape for `plain` (smoke test)")
    parser.add_argument("--rows", default="plain,0.5b:1,0.5b:2,0.5b:4")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seqs", type=int, default=64, help="sequences per GPU per step")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--min-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--micro-batch-tokens", type=int, default=None, help="default: the trainer's (by world size)")
    parser.add_argument("--lora-r", type=int, default=0)
    parser.add_argument("--gc", action="store_true")
    parser.add_argument("--grad-sync", default="auto", help="the trainer's --grad-sync (default: its own)")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-cuda-graphs", action="store_true", help="worker: the eager step (row flag :nographs)")
    parser.add_argument("--profile", action="store_true", help="worker: print a profile of one more step")
    parser.add_argument("--detail", action="store_true", help="worker: per-rank, per-step costs (row flag :detail)")
    parser.add_argument("--near-gpu", action="store_true", help="worker: bind to the GPU's NUMA node (row flag :numa)")
    parser.add_argument("--parallel", default="auto", help="worker: the trainer's --parallel (auto, fsdp, replicate)")
    parser.add_argument("--knobs", default="", help="worker: r (layers never reshard after forward)")
    parser.add_argument("--gpu", default=None, help="driver: run every row on this CUDA_VISIBLE_DEVICES")
    parser.add_argument("--row-timeout", type=float, default=480)
    parser.add_argument("--out", default=None)
    parser.add_argument("--logs", default=None, help="driver: write each row's whole output to LOGS/ROW.log")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    import torch

    card = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    lines = [
        f"# many-GPU trainer (FSDP2): {torch.cuda.device_count()} x {card}, torch {torch.__version__}",
        f"{args.seqs} sequences per GPU per step, lengths uniform in {args.min_len}-{args.seq_len}, groups of 8; "
        f"{args.steps} timed steps after {args.warmup} warm-up steps; random weights",
        "",
        "| row | GPUs | how (parallel, micro-batch) | params (B) | tokens/s per GPU | weak-scaling eff. | MFU "
        "| peak GiB/GPU (allocator) | s/step | warm-up s | recompiles | graphs rec/replay/eager/fail |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    base: dict[str, float] = {}  # shape -> its one-process row's tokens/s (weak scaling is against it)
    details: list[str] = []  # the per-rank lines of `:detail` rows, printed under the main table
    plain_shape = "tiny" if args.tiny else "0.5b"
    for spec in args.rows.split(","):
        r = run_row(spec, args)
        parts = spec.split(":")
        shape = row_shape(spec, plain_shape)
        if "error" in r:
            line = f"| {spec} | failed: {r['error']} |"
        else:
            if parts[0] == "plain":
                base.setdefault(shape, r["tokens_per_s_per_gpu"])
            eff = ""
            if shape in base and parts[0] != "plain" and ":lora" not in spec:
                eff = f"{r['tokens_per_s_per_gpu'] / base[shape]:.1%}"
            line = (
                f"| {spec} | {r['world']} | {r['how']} | {r['params_b']:.2f} | {r['tokens_per_s_per_gpu']:,.0f} "
                f"| {eff} "
                f"| {r['mfu']:.1%} | {r['peak_gib']:.1f} ({r['reserved_gib']:.1f} reserved, "
                f"{r['alloc_retries']} retries) | {r['s_per_step']:.2f} | {r['warmup_s']:.0f} "
                f"| {r.get('recompiles', '')} | {r.get('graphs', '')} |"
            )
            if "moe_aux_loss" in r:  # MoE rows: the last step's load balance (trainer/step/router.py)
                moe = r["moe_aux_loss"], r["moe_load_max"], r["moe_load_min"]
                line += " MoE: aux {:.3f}, load max {:.2f} min {:.2f}".format(*moe)
        lines.append(line)
        print(line, flush=True)
        if r.get("detail"):
            details += detail_lines(spec, r["detail"])
        if args.out:  # after every row: a run cut short keeps the rows it finished
            Path(args.out).write_text("\n".join(lines + (DETAIL_HEAD + details if details else [])) + "\n")
    if details:
        print("\n".join(DETAIL_HEAD + details), flush=True)


if __name__ == "__main__":
    main()
