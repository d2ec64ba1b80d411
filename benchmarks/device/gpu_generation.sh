# One H100: the rollout engine (prefix-shared groups vs distinct prompts, compiled step vs not) beside transformers
# generate, then the one-command loop's step split. Wheels: setup.sh.
source benchmarks/device/setup.sh
timeout ${GEN_TIMEOUT:-420} python3 benchmarks/bench_generation.py --out "$OUT/generation.md" ${GEN_ARGS:-} 2>&1 \
  | grep -v "^W1\|warn" | tee "$OUT/gen.log"
