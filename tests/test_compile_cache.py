"""Compiles kept across runs (atropos_cli/compile_cache.py): where the cache lives, and that a second process
loads the first one's compiled graph instead of generating it (inductor's own cache counters)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from atropos_cli.compile_cache import ENV, cache_dir

# a process that compiles one small function the way the engine does (compile_cache.enable() first), and
# prints inductor's FX-graph cache counters
PROGRAM = """
import json, torch
from atropos_cli import compile_cache
root = compile_cache.enable()
from torch._dynamo.utils import counters
fn = torch.compile(lambda x: x * 3 + 1, dynamic=False)
fn(torch.randn(8))
print(json.dumps({"root": str(root), "hit": counters["inductor"]["fxgraph_cache_hit"],
                  "miss": counters["inductor"]["fxgraph_cache_miss"]}))
"""


def test_the_cache_directory_follows_the_environment_per_torch_version(tmp_path: Path) -> None:
    home = Path.home() / ".cache" / "atropos" / "compile" / "torch-2.13.0-cpu"
    assert cache_dir({}, "2.13.0+cpu") == home
    assert cache_dir({"XDG_CACHE_HOME": str(tmp_path)}, "2.11.0") == tmp_path / "atropos/compile/torch-2.11.0"
    assert cache_dir({ENV: str(tmp_path / "c")}, "2.11.0") == tmp_path / "c" / "torch-2.11.0"
    assert cache_dir({ENV: "off"}, "2.11.0") is None


def _compile(env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_first_ones_compile(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_"))}
    env[ENV] = str(tmp_path / "cache")
    first = _compile(env)
    root = Path(first["root"])
    assert root.parent == tmp_path / "cache" and root.name.startswith("torch-")
    assert first["miss"] >= 1 and first["hit"] == 0
    assert any((root / "inductor").rglob("*")), "nothing was written to the cache"
    second = _compile(env)
    assert second["hit"] >= 1 and second["miss"] == 0  # loaded, not compiled again


def test_a_cache_directory_the_user_chose_for_torch_wins(tmp_path: Path) -> None:
    program = "import os; from atropos_cli import compile_cache; compile_cache.enable(); "
    program += "print(os.environ['TORCHINDUCTOR_CACHE_DIR'], os.environ['TRITON_CACHE_DIR'])"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_"))}
    env |= {ENV: str(tmp_path / "ours"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "theirs")}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=120)
    inductor, triton = done.stdout.split()
    assert inductor == str(tmp_path / "theirs") and Path(triton).parent.parent == tmp_path / "ours"
