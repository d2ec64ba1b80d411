# One 4-GPU host, one call (under 7 minutes), jobs side by side, one GPU each (issue 23):
# GPU 0: the trainer's step profiled phase by phase (`profile_timeline.py`), defaults, mixed then equal (Must 1);
# GPU 1: the engine profile at batch 64 and 512 (`profile_engine.py`: replays vs host, kernels by kind) (Must 3);
# GPU 2: the trainer, default micro-batch (16k) against 32k tokens, mixed and equal (Must 1).
source benchmarks/device/setup.sh
(CUDA_VISIBLE_DEVICES=0 timeout 400 bash -c "python3 benchmarks/profile_timeline.py --variant a:0:a:auto:a --mixed \
  --out $OUT/prof_mixed > $OUT/prof_mixed.log 2>&1; python3 benchmarks/profile_timeline.py --variant a:0:a:auto:a \
  --out $OUT/prof_equal > $OUT/prof_equal.log 2>&1") &
(CUDA_VISIBLE_DEVICES=1 timeout 400 python3 benchmarks/profile_engine.py --batches 64,512 \
  --out "$OUT/engine_profile.md" > "$OUT/profile.log" 2>&1) &
CUDA_VISIBLE_DEVICES=2 TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0 timeout 400 \
  python3 benchmarks/bench_trainer.py --steps 6 --warmup 3 --lengths mixed,equal --no-grad-check \
  --ours-mixed "a:0:a:auto:a,32768:0:a:auto:a" --ours-equal "a:0:a:auto:a,32768:0:a:auto:a" --atropos "" \
  --out "$OUT/trainer.md" > "$OUT/trainer.log" 2>&1
wait
rm -f "$OUT"/prof_*/*.json.gz  # the traces stay on the machine (size)
echo "== trainer"; cat "$OUT/trainer.md" 2>/dev/null || grep -v "^W1\|warn" "$OUT/trainer.log" | tail -30
echo "== profile mixed"; grep -v "^W1\|warn" "$OUT/prof_mixed.log" | head -80
echo "== profile equal"; grep -v "^W1\|warn" "$OUT/prof_equal.log" | head -60
echo "== engine profile"; cat "$OUT/engine_profile.md" 2>/dev/null || tail -30 "$OUT/profile.log"
