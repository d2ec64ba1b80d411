# One 4-GPU host, one call (under 9 minutes): issue 23 Must 2 after the replicas' gradient sum was overlapped with
# the last backward (trainer/scale/replicate.py: OverlappedSum). Rows: the one-process 0.5B reference, 0.5B at 2
# and 4 ranks at the defaults (`--parallel auto`: what it picks is in the "how" column) and forced replicate at 4,
# FSDP at 4, all with `:detail` (per rank and step: wall, micro-batches, tokens, prepare/collate host ms, GPU
# tail, reduce wait, buckets started during the backward, gen-2 GC), then the one-process 1.5B profile (owed).
# Every row's whole output is kept in $OUT/rows/; the tables in $OUT/fsdp.md and on stdout.
source benchmarks/device/setup.sh
timeout "${FSDP_TIMEOUT:-520}" python3 benchmarks/bench_fsdp.py --steps "${STEPS:-3}" --warmup 2 \
  --row-timeout "${ROW_TIMEOUT:-100}" --logs "$OUT/rows" \
  --rows "${FSDP_ROWS:-plain:detail,0.5b:2:detail,0.5b:4:detail,0.5b:4:replicate:detail,0.5b:4:fsdp:detail,plain:1.5b:prof}" \
  --out "$OUT/fsdp.md" 2>&1 | grep -v "Warning\|warn" | tee "$OUT/fsdp.log"
