"""Two ranks: rank 0 (a trainer) pushes a model's weights twice with `WeightPusher`, rank 1 (an engine) receives
them with `WeightReceiver` into a model initialised differently and applies the newest. Each rank writes a digest
of its weights (as the engines' dtype holds them) to OUT/rank{r}.json. NCCL between two GPUs; `--cpu`: gloo on
the CPU (a check of this script itself). Run by tests/gpu/test_gpu_weight_push.py:

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/gpu/weight_push_ranks.py OUT
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from atropos_cli.trainer.weights.weight_push import WeightPusher, WeightReceiver  # noqa: E402
from tiny_models import tiny_causal_lm  # noqa: E402

PUSHED = torch.bfloat16  # the engines' dtype


def digest(model: torch.nn.Module) -> dict[str, str]:
    return {
        key: hashlib.sha256(t.detach().to(PUSHED).float().cpu().numpy().tobytes()).hexdigest()
        for key, t in model.state_dict().items()
    }


def main() -> None:
    out, cpu = Path(sys.argv[1]), "--cpu" in sys.argv
    rank = int(os.environ["RANK"])
    device = "cpu" if cpu else f"cuda:{rank}"
    if not cpu:
        torch.cuda.set_device(rank)
    dist.init_process_group("gloo" if cpu else "nccl")
    control = dist.new_group([0, 1], backend="gloo")
    data = dist.new_group([0, 1])
    model = tiny_causal_lm("qwen", vocab_size=300, seed=rank).to(device)  # different weights on each rank
    result: dict = {"before": digest(model)}
    if rank == 0:
        pusher = WeightPusher(control, data, 0, True, PUSHED, device)
        for version in (1, 2):
            with torch.no_grad():
                for param in model.parameters():
                    param.add_(0.01 * version)
            result[f"push{version}"] = pusher.push(model, version, drawn=version)
        pusher.credit(2, drawn=3)  # a batch taken without a step: no weights, one more batch
        pusher.stop()
    else:
        receiver = WeightReceiver(control, data, 0, device)
        receiver.start()
        result["arrived"] = receiver.wait_for(2, timeout=120)
        result["version"] = receiver.apply(model)
        result["credited"] = receiver.wait_for(3, timeout=120, drawn=True) and receiver.received == 2
        result["error"] = receiver.error
        result["stopped"] = receiver.wait_for(3, timeout=120) is False and receiver.stopped  # the trainer's stop
    result["after"] = digest(model)
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
