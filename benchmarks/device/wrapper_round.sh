# One 4-GPU host, one call (under 8 minutes), four jobs side by side, one GPU each (issue 23, session 9, call 1):
# GPU 0: the trainer, defaults against inductor's C++ wrapper for the compiled layers (a "c" knob of
#        bench_trainer.py in that call, removed after it: the wrapper refused varlen attention's List[int]
#        argument, results/trainer_gpu.md), mixed and equal lengths, Atropos' example_trainer in the same run;
# GPU 1: the engine profile at batch 64 and 512 (`profile_engine.py`) (Must 3);
# GPU 2: the one-command loop's step split, 6 steps, with the engine-width and recompile fixes (Must 4);
# GPU 3: the engine at batch 64 with the Triton kernel beside transformers generate (Must 3).
source benchmarks/device/setup.sh
(CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0 timeout ${TRAIN_TIMEOUT:-420} \
  python3 benchmarks/bench_trainer.py --steps 6 --warmup 3 --lengths mixed,equal --no-grad-check \
  --ours-mixed "a:0:a:auto:a" --ours-equal "a:0:a:auto:a" --atropos 32:1 \
  --out "$OUT/trainer.md" > "$OUT/trainer.log" 2>&1) &
(CUDA_VISIBLE_DEVICES=1 timeout 420 python3 benchmarks/profile_engine.py --batches 64,512 \
  --out "$OUT/engine_profile.md" > "$OUT/profile.log" 2>&1) &
(CUDA_VISIBLE_DEVICES=3 GEN_BATCHES=64 GEN_VARIANTS=8:1:t timeout 420 bash benchmarks/device/gen_engine.sh \
  > "$OUT/gen.log" 2>&1) &
CUDA_VISIBLE_DEVICES=2 LOOP_STEPS=${LOOP_STEPS:-6} LOOP_TIMEOUT=420 bash benchmarks/device/loop_split.sh > /dev/null 2>&1
wait
echo "== trainer"; cat "$OUT/trainer.md" 2>/dev/null || grep -v "^W1\|warn" "$OUT/trainer.log" | tail -30
echo "== loop"; cat "$OUT/loop_split.md" 2>/dev/null || tail -20 "$OUT/loop.log"
echo "== engine"; cat "$OUT/generation.md" 2>/dev/null || grep "^|\|Error" "$OUT/gen.log" | tail -30
echo "== profile"; cat "$OUT/engine_profile.md" 2>/dev/null || tail -30 "$OUT/profile.log"
