#!/usr/bin/env bash
# The GPU measurements, one driver with named rounds. Run on a GPU machine from the repository root, with $OUT an
# empty folder for the results and this package's wheel (plus any wheels the machine lacks) in .whl/, built here
# just before with `pip wheel --no-deps . -w .whl`:
#
#     bash benchmarks/device/run.sh ROUND                 one round, on the GPUs the machine has
#     bash benchmarks/device/run.sh ROUND@GPUS ...        several rounds side by side, each on its own GPUs
#                                                         (e.g. trainer@0 engine-profile@1 async@2,3), each with
#                                                         its own time limit (LIMIT seconds, default 400)
#
# Each round writes its tables to $OUT/ROUND/ and prints them; a round cut short keeps what it finished. Results
# files in benchmarks/results/ name the round they came from. Rounds (one GPU unless marked):
#
#   trainer          bench_trainer.py --isolate on FAMILY (a published shape; default Qwen2.5-0.5B): the trainer's
#                    defaults, mixed and equal lengths, each row in REPEAT (2) fresh processes, WARMUP (40)
#                    warm-up and STEPS (10) timed steps; then Atropos' example_trainer on the same card and shape
#                    (ATROPOS=0 skips it). MIXED= / EQUAL= add rows
#                    (bench_trainer.parse_variant specs, comma-separated; e.g. a 32k micro-batch:
#                    MIXED=a:0:a:auto:a,32768:0:a:auto:a).
#   graphs           CUDA graphs of whole micro-batches: the numerics check against eager steps (check_graphs.py),
#                    then the defaults (graphs) against knob g (no graphs), mixed and equal, in fresh processes.
#   trainer-profile  profile_timeline.py: the trainer's step phase by phase, mixed then equal lengths.
#   generation       bench_generation.py: the rollout engine at GEN_BATCHES (512,64) for GEN_VARIANTS (8:1:t, the
#                    Triton decode kernel) beside transformers generate, with the logprob contract checked.
#   families         bench_generation.py --family: FAMILIES (a comma list of published shapes of
#                    atropos_cli/families.py; default the small ones) at GEN_BATCHES (512): each shape's engine
#                    exactness past its window, then ours beside transformers generate. Run several side by side
#                    (families@0 families@1 ...) with FAMILIES set per round through FAMILIES_<GPU>.
#   engine-profile   profile_engine.py at ENGINE_BATCHES (64,512) on ENGINE_FAMILY (a published shape; default
#                    Qwen2.5-0.5B): a decode step split into graph replays and host work, its kernels by kind.
#   loop-split       the one-command loop on the 0.5B shape (`atropos train arithmetic`, 32 groups x 8 a step,
#                    LOOP_STEPS (5) steps): generation / scoring / training / weight sync / engine batches a step.
#   async            (2 GPUs) bench_async.py: a smoke row (SMOKE=0 skips it), then the colocated sync loop against async 1 (1 trainer
#                    + 1 engine GPU, --max-staleness 1) for MODELS (0.5b; tiny: the shipped model, which learns)
#                    on ENVS (long,multiturn; also arithmetic, count, tool: the multi-turn tool env), STEPS (5)
#                    steps of GROUPS (16) x 8, the first 2 untimed; LONG (384): the count env's tokens, LONG_GEN
#                    (1024): the long env's; a row gets COMPILE_TIMEOUT (150) s for its warm-up steps, then
#                    ROW_TIMEOUT (60) s. Side by side (async@0,1 async@2,3) with ENVS per round through
#                    ENVS_<first GPU>.
#   async-four       (4 GPUs) bench_async.py --layouts LAYOUTS (1+3,2+2,3+1) --auto: sync on 4 GPUs, that run
#                    resumed with --inference-gpus auto (its choice printed), async 1 on each split, for MODELS
#                    (0.5b) on ENVS (long), as in async.
#   async-curves     (2 GPUs) bench_async.py --seeds SEEDS (0,1,2) --curves: sync against async 1 (1+1) on the
#                    tiny model, CURVE_ENVS (arithmetic,count), CURVE_STEPS (15) steps of 32 groups x 8 each: the
#                    per-step reward's mean and min-max over the seeds per mode, and a plot (async_curves.png).
#                    Side by side with CURVE_ENVS_<first GPU>.
#   fsdp             (2-4 GPUs) bench_fsdp.py weak scaling: a one-step smoke row, then ROWS (plain,0.5b:2,0.5b:4,
#                    1.5b:4,3b:4; `:fsdp`/`:replicate` force a mode, `:detail` prints per-rank timings, `:prof` a
#                    profile, `:mbtN` the micro-batch), WARMUP (2) + STEPS (3) a row.
#   fsdp-variants    (4 GPUs) the one-GPU FSDP overhead, variant by variant, one GPU each, and a profiled step.
#   replicas         (4 GPUs) replicas replaying CUDA graphs: check_graphs.py with 2 replicas and with one
#                    process, bench_trainer's early steps with the narrow shapes recorded ahead against knob n
#                    (CHECK=0 skips these), then bench_fsdp.py ROWS (plain,0.5b:2,0.5b:4) after WARMUP (30)
#                    warm-up steps, STEPS (10) timed.
#   fsdp-large       (4 GPUs) the 7B shape under FSDP: full fine-tuning (--grad-sync micro-batch) and LoRA r=16.
#   fsdp-families    (4 GPUs) bench_fsdp.py rows of published shapes too large for one rank to build whole, at the
#                    trainer's defaults (meta-device build, each rank draws its shards): ROWS (Llama-3.1-8B:4,
#                    Qwen3-30B-A3B:4:lora16,gpt-oss-20b:4:lora16), CAP (80) GiB a process, WARMUP (1) + STEPS (2)
#                    a row, ROW_TIMEOUT (165) s a row: under 9 minutes in all.
#   loop-four        (4 GPUs) `atropos train arithmetic --nproc-per-node 4`, LOOP_STEPS (100) steps, wall time.
#   gpu-suite        (2 GPUs) the GPU test suite: pytest -m gpu tests/gpu (docs/testing.md).
#   compile-cache    bench_compile_cache.py: `atropos train`'s first step with an empty compile cache, then warm,
#                    on SHAPES (Qwen2.5-0.5B).
#   trainer-families bench_fsdp.py one-process rows (plain:SHAPE) of TRAINER_FAMILIES at the trainer's defaults,
#                    mixed lengths, MFU; CAP (80) GiB a process, as an 80 GB card. Several side by side
#                    (trainer-families@2 trainer-families@3) with TRAINER_FAMILIES_<GPU>.
#   tinker           bench_tinker.py on the 0.5B shape (random weights, the tiny tokenizer): the official tinker SDK
#                    (its wheels from .whl-tinker/, installed apart in /tmp/tinker-site, seen by the SDK's side only)
#                    against `atropos serve-trainer`: forward_backward and sample tokens/s at LoRA r=RANK (32), beside
#                    `atropos train arithmetic` TRAIN_STEPS (4) steps in the same run; under 6 minutes.
#   vision           bench_vision.py: a Qwen2.5-VL shape (VISION_SHAPE, Qwen2.5-VL-3B) at full depth, random weights:
#                    rollouts of chats with one image each (VISION_GROUPS (16) prompts x 8, 448 px: 256 image
#                    tokens, 256 new tokens) on the local backend, then trainer steps on those image + text rows
#                    (full fine-tuning; VISION_LORA=16 trains LoRA adapters instead).
#   two-nodes        (4 GPUs) two torchrun launchers of 2 GPUs each (--nnodes 2) against one launcher of 4, same
#                    rollouts and flags: both loss curves and their largest difference.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to an empty folder for the results}"
ROUNDS="trainer graphs trainer-profile generation families engine-profile loop-split async async-four async-curves fsdp
fsdp-variants replicas fsdp-large fsdp-families loop-four two-nodes gpu-suite compile-cache trainer-families tinker vision"
D=a:0:a:auto:a  # bench_trainer's spec of the trainer's defaults
quiet() { grep -v "^W1\|Warning\|warn" || true; }
per_gpu() {  # the value of NAME_<first GPU of this round> if set, else of NAME, else DEFAULT
    local gpus="${CUDA_VISIBLE_DEVICES:-0}" name=$1 default=$2 specific
    specific="${name}_${gpus%%,*}"
    echo "${!specific:-${!name:-$default}}"
}

setup() {  # this package's wheel (and any the machine lacks) from .whl/, first on PYTHONPATH; NVLink multicast off
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "error: cannot install the wheels in .whl/ (build them with: pip wheel --no-deps . -w .whl)" >&2; exit 2; }
    export PYTHONPATH=/tmp/site
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
}

round_trainer() {
    export TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0
    python3 benchmarks/bench_trainer.py --isolate --repeat "${REPEAT:-2}" --steps "${STEPS:-10}" ${FAMILY:+--family "$FAMILY"} \
        --warmup "${WARMUP:-40}" --lengths mixed,equal --no-grad-check --ours-mixed "${MIXED:-$D}" \
        --ours-equal "${EQUAL:-$D}" --atropos "" --out "$OUT/trainer.md" > "$OUT/trainer.log" 2>&1
    cat "$OUT/trainer.md" 2>/dev/null || quiet < "$OUT/trainer.log" | tail -30
    grep "^  ours" "$OUT/trainer.log"  # each run's tokens/s and timed step times
    if [ "${ATROPOS:-1}" = 1 ]; then
        python3 benchmarks/bench_trainer.py --steps 9 --warmup 3 --lengths mixed,equal --no-grad-check ${FAMILY:+--family "$FAMILY"} \
            --ours-mixed "" --ours-equal "" --atropos 32:1 --out "$OUT/atropos.md" > "$OUT/atropos.log" 2>&1
        grep "^| Atropos" "$OUT/atropos.md" 2>/dev/null || quiet < "$OUT/atropos.log" | tail -10
    fi
}

round_graphs() {
    export TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0
    python3 benchmarks/check_graphs.py --steps "${CHECK_STEPS:-5}" > "$OUT/check.md" 2> "$OUT/check.err"
    echo "check rc=$?"; cat "$OUT/check.md"; quiet < "$OUT/check.err" | tail -8
    python3 benchmarks/bench_trainer.py --isolate --repeat "${REPEAT:-2}" --steps "${STEPS:-9}" \
        --warmup "${WARMUP:-3}" --lengths mixed,equal --no-grad-check --ours-mixed "${MIXED:-$D,$D:-:0:g}" \
        --ours-equal "${EQUAL:-$D,$D:-:0:g}" --atropos "" --out "$OUT/trainer.md" > "$OUT/trainer.log" 2>&1
    cat "$OUT/trainer.md" 2>/dev/null || quiet < "$OUT/trainer.log" | tail -30
    grep "^  ours\|CUDA graphs\|Error\|error" "$OUT/trainer.log" | head -40
}

round_trainer_profile() {
    python3 benchmarks/profile_timeline.py --variant "$D" --mixed --out "$OUT/prof_mixed" > "$OUT/prof_mixed.log" 2>&1
    python3 benchmarks/profile_timeline.py --variant "$D" --out "$OUT/prof_equal" > "$OUT/prof_equal.log" 2>&1
    rm -f "$OUT"/prof_*/*.json*  # the traces are too large to bring back
    echo "== mixed"; quiet < "$OUT/prof_mixed.log" | head -80
    echo "== equal"; quiet < "$OUT/prof_equal.log" | head -60
}

round_generation() {
    python3 benchmarks/bench_generation.py --batches "${GEN_BATCHES:-512,64}" --variants "${GEN_VARIANTS:-8:1:t}" \
        --contract-attention t --old-loop-batches none --no-loop --out "$OUT/generation.md" > "$OUT/gen.log" 2>&1
    cat "$OUT/generation.md" 2>/dev/null || grep "^|\|Error" "$OUT/gen.log" | tail -30
}

round_families() {
    local gpus="${CUDA_VISIBLE_DEVICES:-0}" list
    list=$(per_gpu FAMILIES Qwen2.5-0.5B,Gemma-3-1B,Qwen3-0.6B,Llama-3.2-1B)
    local name="families-${gpus//,/-}"  # side-by-side rounds of this name share $OUT: one file each
    python3 benchmarks/bench_generation.py --family "$list" --batches "${GEN_BATCHES:-512}" \
        --out "$OUT/$name.md" > "$OUT/$name.log" 2>&1
    cat "$OUT/$name.md" 2>/dev/null || grep "^|\|Error" "$OUT/$name.log" | tail -30
}

round_vision() {
    python3 benchmarks/bench_vision.py --shape "${VISION_SHAPE:-Qwen2.5-VL-3B}" --groups "${VISION_GROUPS:-16}" \
        --lora-r "${VISION_LORA:-0}" --out "$OUT/vision.md" > "$OUT/vision.log" 2>&1
    cat "$OUT/vision.md" 2>/dev/null || quiet < "$OUT/vision.log" | tail -30
}

round_engine_profile() {
    python3 benchmarks/profile_engine.py --batches "${ENGINE_BATCHES:-64,512}" ${ENGINE_FAMILY:+--family "$ENGINE_FAMILY"} \
        --out "$OUT/engine_profile.md" \
        > "$OUT/profile.log" 2>&1
    cat "$OUT/engine_profile.md" 2>/dev/null || tail -30 "$OUT/profile.log"
}

round_loop_split() {
    python3 benchmarks/bench_generation.py --loop-only --loop-steps "${LOOP_STEPS:-5}" \
        --loop-timeout "${LOOP_TIMEOUT:-250}" --out "$OUT/loop_split.md" > "$OUT/loop.log" 2>&1
    cat "$OUT/loop_split.md" 2>/dev/null || quiet < "$OUT/loop.log" | tail -20
}

bench_async() {  # bench_async.py with the rounds' shared row limits, one compile cache for the call
    python3 benchmarks/bench_async.py --steps "${STEPS:-5}" --warmup 2 --groups "${GROUPS:-16}" \
        --long-tokens "${LONG:-384}" --long-gen-tokens "${LONG_GEN:-1024}" --timeout "${ROW_TIMEOUT:-60}" \
        --compile-timeout "${COMPILE_TIMEOUT:-150}" --compile-cache /tmp/atropos-compile "$@"
}

round_async() {
    local gpus="${CUDA_VISIBLE_DEVICES:-0}" envs name
    envs=$(per_gpu ENVS long,multiturn)
    name="async-${gpus//,/-}"  # side-by-side rounds of this name share $OUT: one file each
    if [ "${SMOKE:-1}" = 1 ]; then
        python3 benchmarks/bench_async.py --models tiny --envs arithmetic --modes "async 1" --steps 2 --warmup 0 \
            --groups 4 --timeout 120 --compile-cache /tmp/atropos-compile > "$OUT/$name-smoke.log" 2>&1
        if grep -q '"error"' "$OUT/$name-smoke.log"; then tail -5 "$OUT/$name-smoke.log"; return 1; fi
    fi
    bench_async --models "${MODELS:-0.5b}" --envs "$envs" --modes "sync,async 1" --out "$OUT/$name.md" \
        > "$OUT/$name.log" 2>&1
    grep -h '^{"mode"' "$OUT/$name.log"; cat "$OUT/$name.md" 2>/dev/null
}

round_async_four() {
    bench_async --models "${MODELS:-0.5b}" --envs "${ENVS:-long}" --modes "sync,async 1" \
        --layouts "${LAYOUTS:-1+3,2+2,3+1}" --auto --out "$OUT/async_four.md" > "$OUT/async_four.log" 2>&1
    grep -h '^{"mode"' "$OUT/async_four.log"; cat "$OUT/async_four.md" 2>/dev/null
}

round_async_curves() {
    local gpus="${CUDA_VISIBLE_DEVICES:-0}" name
    name="async-curves-${gpus//,/-}"
    python3 benchmarks/bench_async.py --models tiny --envs "$(per_gpu CURVE_ENVS arithmetic,count)" \
        --modes "sync,async 1" --seeds "${SEEDS:-0,1,2}" --steps "${CURVE_STEPS:-15}" --warmup 2 --groups 32 \
        --timeout "${ROW_TIMEOUT:-60}" --compile-timeout "${COMPILE_TIMEOUT:-150}" \
        --compile-cache /tmp/atropos-compile --curves "$OUT/$name.md" > "$OUT/$name.log" 2>&1
    grep -h '^{"mode"' "$OUT/$name.log"; cat "$OUT/$name.md" 2>/dev/null
}

round_fsdp() {
    python3 benchmarks/bench_fsdp.py --rows 0.5b:2 --steps 1 --warmup 1 2>&1 | tail -1 | tee "$OUT/smoke.log"
    grep -q "failed" "$OUT/smoke.log" && return 1
    python3 benchmarks/bench_fsdp.py --steps "${STEPS:-3}" --warmup "${WARMUP:-2}" --row-timeout "${ROW_TIMEOUT:-150}" \
        --logs "$OUT/rows" --rows "${ROWS:-plain,0.5b:2,0.5b:4,1.5b:4,3b:4}" --out "$OUT/fsdp.md" 2>&1 \
        | quiet | tee "$OUT/fsdp.log"
}

round_fsdp_variants() {
    local bench="python3 benchmarks/bench_fsdp.py --steps 4 --warmup 2"
    $bench --gpu 0 --rows plain,0.5b:1:prof > "$OUT/v0.log" 2>&1 &
    $bench --gpu 1 --rows 0.5b:1:nocompile,0.5b:1:k=f > "$OUT/v1.log" 2>&1 &
    $bench --gpu 2 --rows 0.5b:1:k=r,0.5b:1:k=r+f > "$OUT/v2.log" 2>&1 &
    $bench --gpu 3 --rows 0.5b:1:mbt16384,0.5b:1:k=r+f:mbt16384 > "$OUT/v3.log" 2>&1 &
    wait
    grep -h "^| [0p]" "$OUT"/v*.log
}

round_replicas() {
    export TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0
    if [ "${CHECK:-1}" = 1 ]; then
        CUDA_VISIBLE_DEVICES=0,1 timeout 300 python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
            benchmarks/check_graphs.py --steps "${CHECK_STEPS:-4}" > "$OUT/check2.md" 2> "$OUT/check2.err" &
        CUDA_VISIBLE_DEVICES=2 timeout 300 python3 benchmarks/check_graphs.py --steps "${CHECK_STEPS:-4}" \
            > "$OUT/check1.md" 2> "$OUT/check1.err" &
        CUDA_VISIBLE_DEVICES=3 timeout 300 python3 benchmarks/bench_trainer.py --isolate --repeat 1 --steps 9 \
            --warmup "${EARLY:-3}" --lengths mixed --no-grad-check --ours-mixed "$D,$D:-:0:n" --atropos "" \
            --out "$OUT/early.md" > "$OUT/early.log" 2>&1 &
        wait
        for f in check2 check1; do echo "== $f"; cat "$OUT/$f.md"; quiet < "$OUT/$f.err" | tail -6; done
        echo "== early"; cat "$OUT/early.md" 2>/dev/null; grep "CUDA graphs\|Error" "$OUT/early.log" | head
    fi
    python3 benchmarks/bench_fsdp.py --steps "${STEPS:-10}" --warmup "${WARMUP:-30}" --row-timeout "${ROW_TIMEOUT:-150}" \
        --logs "$OUT/rows" --rows "${ROWS:-plain,0.5b:2,0.5b:4}" --out "$OUT/fsdp.md" 2>&1 | quiet | tee "$OUT/fsdp.log"
}

round_fsdp_large() {
    python3 benchmarks/bench_fsdp.py --rows "${ROWS:-7b:4:micro,7b:4:lora16}" --steps 3 --warmup 2 \
        --row-timeout "${ROW_TIMEOUT:-200}" --out "$OUT/fsdp_large.md" 2>&1 | quiet | tee "$OUT/fsdp_large.log"
}

round_fsdp_families() {
    python3 benchmarks/bench_fsdp.py --rows "${ROWS:-Llama-3.1-8B:4,Qwen3-30B-A3B:4:lora16,gpt-oss-20b:4:lora16}" \
        --cap-gib "${CAP:-80}" --steps "${STEPS:-2}" --warmup "${WARMUP:-1}" --row-timeout "${ROW_TIMEOUT:-165}" \
        --logs "$OUT/rows" --out "$OUT/fsdp_families.md" 2>&1 | quiet | tee "$OUT/fsdp_families.log"
}

round_loop_four() {
    local start; start=$(date +%s)
    python3 -m atropos_cli train arithmetic --nproc-per-node 4 --steps "${LOOP_STEPS:-100}" --out /tmp/loop4 \
        > "$OUT/loop4.log" 2>&1
    echo "one-command loop wall: $(( $(date +%s) - start )) s" | tee -a "$OUT/loop4.log"
    grep -v "^\[rank" "$OUT/loop4.log" | tail -4
    cp /tmp/loop4/metrics.jsonl "$OUT/loop4_metrics.jsonl"
}

round_two_nodes() {
    python3 -m atropos_cli process arithmetic --out /tmp/roll --overwrite --env.total_steps 200 --env.group_size 8 \
        > /dev/null
    local flags="train --data /tmp/roll --steps 20 --groups-per-step 8 --save-every 10 --epochs 5"
    # shellcheck disable=SC2086  # flags is a list of words
    python3 -m atropos_cli $flags --out /tmp/one --nproc-per-node 4 | tail -2
    for node in 0 1; do
        # shellcheck disable=SC2086
        CUDA_VISIBLE_DEVICES=$((2 * node)),$((2 * node + 1)) python3 -m torch.distributed.run --nnodes 2 \
            --node-rank "$node" --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 29533 \
            -m atropos_cli $flags --out /tmp/two > "$OUT/node$node.log" 2>&1 &
    done
    wait
    tail -2 "$OUT/node0.log"
    python3 - <<'PY' | tee "$OUT/two_nodes.md"
import json
one = [json.loads(line) for line in open("/tmp/one/metrics.jsonl")]
two = [json.loads(line) for line in open("/tmp/two/metrics.jsonl")]
print("step  loss(1 launcher)  loss(2 launchers)  grad_norm(1)  grad_norm(2)")
for a, b in zip(one, two):
    print(a["step"], f"{a['loss']:+.6f}", f"{b['loss']:+.6f}", f"{a['grad_norm']:.5f}", f"{b['grad_norm']:.5f}")
print("largest loss difference:", max(abs(a["loss"] - b["loss"]) for a, b in zip(one, two)))
PY
}

round_gpu_suite() {
    python3 -m pytest -m gpu tests/gpu -v -rs -p no:cacheprovider > "$OUT/gpu_suite.log" 2>&1
    echo "pytest rc=$?"; grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/gpu_suite.log" | tail -60
}

round_compile_cache() {
    python3 benchmarks/bench_compile_cache.py --shapes "${SHAPES:-Qwen2.5-0.5B}" --out "$OUT/compile_cache.md" \
        > "$OUT/compile_cache.log" 2>&1
    cat "$OUT/compile_cache.md" 2>/dev/null || tail -20 "$OUT/compile_cache.log"
}

round_trainer_families() {
    local gpus="${CUDA_VISIBLE_DEVICES:-0}" list rows="" shape
    list=$(per_gpu TRAINER_FAMILIES Llama-3.2-1B,Qwen3-1.7B)
    for shape in ${list//,/ }; do rows+="plain:$shape,"; done
    python3 benchmarks/bench_fsdp.py --rows "${rows%,}" --cap-gib "${CAP:-80}" --steps "${STEPS:-3}" \
        --warmup "${WARMUP:-2}" --row-timeout "${ROW_TIMEOUT:-200}" --out "$OUT/trainer-families-${gpus//,/-}.md" 2>&1 \
        | quiet | tee "$OUT/trainer-families-${gpus//,/-}.log"
}

round_tinker() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/tinker-site \
        .whl-tinker/*.whl || { echo "error: cannot install the tinker SDK's wheels from .whl-tinker/" >&2; return 2; }
    printf '#!/bin/sh\nPYTHONPATH=/tmp/tinker-site:%s exec python3 "$@"\n' "$PYTHONPATH" > /tmp/tinker-python
    chmod +x /tmp/tinker-python
    ATROPOS_TINKER_PYTHON=/tmp/tinker-python python3 benchmarks/bench_tinker.py --shape 0.5b --device cuda \
        --rank "${RANK:-32}" --datums 64 --tokens 512 --samples 64 --max-tokens 256 --steps 3 \
        --train-steps "${TRAIN_STEPS:-4}" --sdk-timeout 200 --train-timeout 120 --out "$OUT/tinker.md" \
        > "$OUT/tinker.log" 2>&1
    cat "$OUT/tinker.md" 2>/dev/null || quiet < "$OUT/tinker.log" | tail -30
}

run_round() {  # ROUND: its function, with $OUT/ROUND as its OUT
    local name=$1
    case " $(echo $ROUNDS) " in *" $name "*) ;; *)
        echo "error: unknown round '$name'" >&2; echo "hint: rounds are: $(echo $ROUNDS)" >&2; return 2;;
    esac
    OUT="$OUT/$name"; mkdir -p "$OUT"
    echo "== round $name ($(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown))"
    "round_${name//-/_}"
}

if [ $# -eq 0 ]; then
    echo "usage: bash benchmarks/device/run.sh ROUND | ROUND@GPUS ..." >&2; echo "rounds: $(echo $ROUNDS)" >&2; exit 2
fi
if [ -z "${RUN_SH_SETUP_DONE:-}" ]; then  # once per call: side-by-side rounds share it
    setup
    export RUN_SH_SETUP_DONE=1
fi
if [ $# -eq 1 ] && [[ $1 != *@* ]]; then
    run_round "$1"
    exit $?
fi
pids=()
for spec in "$@"; do  # side by side: each round on its GPUs, with its own limit; each keeps what it finished
    (CUDA_VISIBLE_DEVICES=${spec#*@} timeout "${LIMIT:-400}" bash "$0" "${spec%@*}" > "$OUT/${spec//[@,]/-}.console" 2>&1) &
    pids+=($!)
done
failed=0
for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { failed=1; echo "warning: round ${*:$((i + 1)):1} exited non-zero" >&2; }
done
for spec in "$@"; do cat "$OUT/${spec//[@,]/-}.console"; done
exit "$failed"
