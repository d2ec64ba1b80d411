# One H100, one call (under 5 minutes) (issue 23, session 9, call 7): bench_generation at batch 512 and 64 with
# the sampler's two-stage vocabulary reductions, Triton decode attention, transformers generate beside (Must 3).
source benchmarks/device/setup.sh
GEN_BATCHES=512,64 GEN_VARIANTS=8:1:t timeout 300 bash benchmarks/device/gen_engine.sh > "$OUT/gen.log" 2>&1
cat "$OUT/generation.md" 2>/dev/null || grep -v "Assert" "$OUT/gen.log" | tail -30
