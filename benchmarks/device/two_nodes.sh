# A simulated two-node run: two torchrun launchers on one 4-GPU host (2 GPUs each, --nnodes 2) against one
# launcher of 4, same rollouts and flags; prints both loss curves and their largest difference.
python3 -m atropos_cli process arithmetic --out /tmp/roll --env.total_steps 200 --env.group_size 8 >/dev/null
FLAGS="train --data /tmp/roll --steps 20 --groups-per-step 8 --save-every 10 --epochs 5"
python3 -m atropos_cli $FLAGS --out /tmp/one --nproc-per-node 4 | tail -2
for node in 0 1; do
  CUDA_VISIBLE_DEVICES=$((2 * node)),$((2 * node + 1)) python3 -m torch.distributed.run --nnodes 2 \
    --node-rank $node --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 29533 \
    -m atropos_cli $FLAGS --out /tmp/two > /tmp/node$node.log 2>&1 &
done
wait
tail -2 /tmp/node0.log
python3 - <<'PY'
import json
one = [json.loads(l) for l in open("/tmp/one/metrics.jsonl")]
two = [json.loads(l) for l in open("/tmp/two/metrics.jsonl")]
print("step  loss(1 launcher)  loss(2 launchers)  grad_norm(1)  grad_norm(2)")
for a, b in zip(one, two):
    print(a["step"], f"{a['loss']:+.6f}", f"{b['loss']:+.6f}", f"{a['grad_norm']:.5f}", f"{b['grad_norm']:.5f}")
print("steps", len(one), len(two), "max |loss diff|", max(abs(a["loss"] - b["loss"]) for a, b in zip(one, two)),
      "max rel grad_norm diff", max(abs(a["grad_norm"] - b["grad_norm"]) / a["grad_norm"] for a, b in zip(one, two)))
PY
