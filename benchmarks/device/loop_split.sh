# One GPU, one call, under 5 minutes: only the one-command loop's step split (issue 23, must 4):
# `atropos train arithmetic` on the 0.5B shape (random weights, 384-token vocabulary), --env.max_token_length 256,
# 32 groups x 8 a step, LOOP_STEPS (5) steps; the table (generation / scoring + other / training / weight sync /
# engine batches a step) goes to $OUT/loop_split.md. The first step pays the trainer's and the engine's compiles.
# Wheels: setup.sh (build with `pip wheel --no-deps . -w .whl` just before the call).
source benchmarks/device/setup.sh
timeout ${LOOP_TIMEOUT:-290} python3 benchmarks/bench_generation.py --loop-only --loop-steps ${LOOP_STEPS:-5} \
  --loop-timeout $(( ${LOOP_TIMEOUT:-290} - 40 )) --out "$OUT/loop_split.md" 2>&1 | grep -v "^W1\|warn" \
  | tee "$OUT/loop.log"
