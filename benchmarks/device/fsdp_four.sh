# One 4-GPU host, one call (under 9 minutes): issue 23 Must 2 after the replicas' gradient sum was overlapped with
# the last backward (trainer/scale/replicate.py: OverlappedSum) and each rank prepares only its own groups.
# Rows (bench_fsdp.py), each with `:detail` (per rank and timed step: the GPU's NUMA node and the rank's CPUs,
# wall, micro-batches, tokens, prepare/collate host ms, GPU tail, reduce wait, buckets started during the
# backward, gen-2 GC):
#   plain                      the one-process 0.5B reference (weak scaling is against it)
#   0.5b:2                     2 ranks at the defaults (`--parallel auto`: replicate for 0.5B on 2-4 ranks)
#   0.5b:4:replicate           4 replicas: the row the overlap is for (64.1% before it)
#   0.5b:4                     4 ranks at the defaults (`auto` replicates a 0.5B model on up to 4 ranks since session 8)
#   0.5b:4:replicate:numa      4 replicas, each bound to its GPU's NUMA node (does host placement matter?)
#   plain:1.5b:prof            the one-process 1.5B profile still owed (the MFU anomaly), printed in full
# Every row's whole output is kept in $OUT/rows/; the tables in $OUT/fsdp.md (rewritten after each row, so a
# run cut short keeps what finished) and on stdout (the per-rank table at the end).
source benchmarks/device/setup.sh
ROWS="plain:detail,0.5b:2:detail,0.5b:4:replicate:detail,0.5b:4:detail,0.5b:4:replicate:detail:numa,plain:1.5b:prof"
timeout "${FSDP_TIMEOUT:-510}" python3 benchmarks/bench_fsdp.py --steps "${STEPS:-3}" --warmup 2 \
  --row-timeout "${ROW_TIMEOUT:-120}" --logs "$OUT/rows" --rows "${FSDP_ROWS:-$ROWS}" \
  --out "$OUT/fsdp.md" 2>&1 | grep -v "Warning\|warn" | tee "$OUT/fsdp.log"
