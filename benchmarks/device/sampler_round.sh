# One 2-GPU host, one call (under 5 minutes), two jobs side by side (issue 23, session 9, calls 5 and 6): the engine with
# the sampler's two-stage vocabulary reductions.
# GPU 0: bench_generation at batch 512 and 64, Triton decode attention, transformers generate beside (Must 3);
# GPU 1: the engine profile at batch 64 (`profile_engine.py`).
source benchmarks/device/setup.sh
(CUDA_VISIBLE_DEVICES=1 timeout 280 python3 benchmarks/profile_engine.py --batches 64 \
  --out "$OUT/engine_profile_64.md" > "$OUT/profile64.log" 2>&1) &
CUDA_VISIBLE_DEVICES=0 GEN_BATCHES=512,64 GEN_VARIANTS=8:1:t timeout 280 bash benchmarks/device/gen_engine.sh \
  > "$OUT/gen.log" 2>&1
wait
echo "== engine"; cat "$OUT/generation.md" 2>/dev/null || grep "^|\|Error" "$OUT/gen.log" | tail -30
echo "== profile 64"; head -40 "$OUT/engine_profile_64.md" 2>/dev/null || grep -v Assert "$OUT/profile64.log" | tail -30
