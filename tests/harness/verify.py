"""The verifier of tests/harness/agent.py's rollouts: reads the rollout (JSON on stdin) and the agent's
answer.txt in its working directory; prints {"score": 1.0 if the answer names the task's answer, "parts"}."""

from __future__ import annotations

import json
import sys
from pathlib import Path

rollout = json.load(sys.stdin)
answer = (Path(rollout["workdir"]) / "answer.txt").read_text()
correct = float(str(rollout["task"]["answer"]) in answer)
print(json.dumps({"score": correct, "parts": {"correct": correct, "calls": float(rollout["calls"])}}))
