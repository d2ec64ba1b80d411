"""`atropos evaluate`: pass@k, metrics.json layout, samples, report, --resume, --compare, failures."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.resources import shipped_models
from atropos_cli.runs.metrics import ItemResult, compare_metrics, pass_at_k, summarise

runner = CliRunner()


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of all k-subsets of n samples (c correct) that contain a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_is_the_unbiased_estimator():
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert math.isclose(pass_at_k(n, c, k), brute_pass_at_k(n, c, k)), (n, c, k)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4) and pass_at_k(5, 2, 2) == pytest.approx(0.7)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)


def test_summarise_and_compare():
    items = [ItemResult(n=2, correct=2, scores=[1.0, 1.0]), ItemResult(n=2, correct=0, scores=[0.0])]
    metrics = summarise(items, 2)
    assert metrics["pass@1"] == 0.5 and metrics["pass@2"] == 0.5
    assert metrics["pass@1_stderr"] == pytest.approx(0.5)  # stdev([1, 0]) / sqrt(2)
    assert metrics["failed_samples"] == 1 and metrics["num_samples"] == 4
    (row,) = [d for d in compare_metrics({"pass@1": 0.5, "pass@1_stderr": 0.3}, {"pass@1": 0.7, "pass@1_stderr": 0.4})]
    assert row.delta == pytest.approx(0.2) and row.stderr == pytest.approx(0.5)


def evaluate(out: Path, url: str, *args: str):
    return runner.invoke(
        app, ["evaluate", "arithmetic", "--out", str(out), "--openai.base_url", url, "--limit", "6", *args]
    )


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_evaluate_writes_metrics_samples_config_and_report(fake_server, tmp_path):
    server = fake_server(rule="arithmetic", accuracy=0.5, seed=3)
    out = tmp_path / "ev"
    result = evaluate(out, server.base_url, "--num-samples", "4")
    assert result.exit_code == 0, result.output
    assert "pass@4" in result.output and "evaluated 6 items x 4 samples" in result.output
    document = json.loads((out / "metrics.json").read_text())
    assert set(document) == {"config_general", "results"}
    assert document["results"]["all"] == document["results"]["atropos|arithmetic_eval|0"]
    general = document["config_general"]
    assert general["num_samples"] == 4 and isinstance(general["total_evaluation_time_seconds"], str)
    assert general["generation_parameters"]["max_new_tokens"] == 16
    samples = read_jsonl(out / "samples.jsonl")
    assert len(samples) == 24 and {s["sample"] for s in samples} == {0, 1, 2, 3}
    # The metrics are exactly what the samples say.
    by_item = {}
    for s in samples:
        by_item.setdefault(s["index"], []).append(s["correct"])
    expected = sum(pass_at_k(4, sum(v), 2) for v in by_item.values()) / len(by_item)
    assert document["results"]["all"]["pass@2"] == pytest.approx(expected, abs=1e-6)
    assert 0 < document["results"]["all"]["pass@1"] < document["results"]["all"]["pass@4"] <= 1
    assert yaml.safe_load((out / "config.yaml").read_text())["env"]["group_size"] == 4
    html = (out / "report.html").read_text()
    assert "pass@4" in html and "What is" in html


def test_report_escapes_model_output(fake_server, tmp_path):
    server = fake_server(rule=["<b>1</b>"])  # within the 16-token budget
    out = tmp_path / "ev"
    assert evaluate(out, server.base_url).exit_code == 0
    html = (out / "report.html").read_text()
    assert "<b>1</b>" not in html and "&lt;b&gt;1&lt;/b&gt;" in html


def test_resume_skips_finished_items_and_refuses_a_changed_config(fake_server, tmp_path):
    server = fake_server(rule="arithmetic", accuracy=1.0)
    out = tmp_path / "ev"
    assert evaluate(out, server.base_url, "--num-samples", "2").exit_code == 0
    samples = (out / "samples.jsonl").read_text().splitlines()
    # Simulate a crash: items 3-5 never written, item 2 written halfway (one of its two samples, torn).
    kept = [line for line in samples if json.loads(line)["index"] < 2]
    half = next(line for line in samples if json.loads(line)["index"] == 2)
    (out / "samples.jsonl").write_text("\n".join(kept) + "\n" + half + "\n" + half[:10])
    server.reset_stats()

    result = evaluate(out, server.base_url, "--num-samples", "2", "--resume")
    assert result.exit_code == 0, result.output
    assert server.stats()["requests"] == 4  # items 2..5 only
    final = read_jsonl(out / "samples.jsonl")
    assert sorted((s["index"], s["sample"]) for s in final) == [(i, j) for i in range(6) for j in range(2)]
    assert json.loads((out / "metrics.json").read_text())["results"]["all"]["pass@1"] == 1.0

    changed = evaluate(out, server.base_url, "--num-samples", "3", "--resume")
    assert changed.exit_code == 2 and "env.group_size changed" in changed.output
    again = evaluate(out, server.base_url, "--num-samples", "2")
    assert again.exit_code == 2 and "already exists" in again.output and "--resume" in again.output


def test_compare_shows_per_metric_deltas(fake_server, tmp_path):
    good, bad = fake_server(rule="arithmetic", accuracy=1.0), fake_server(rule="arithmetic", accuracy=0.0)
    assert evaluate(tmp_path / "a", bad.base_url, "--num-samples", "2").exit_code == 0
    assert evaluate(tmp_path / "b", good.base_url, "--num-samples", "2").exit_code == 0
    result = runner.invoke(app, ["evaluate", "--compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out",
                                 str(tmp_path / "cmp")])  # fmt: skip
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if "pass@1 " in x or x.strip().startswith("│ pass@1 "))
    assert "0.0000" in line and "1.0000" in line and "+1.0000" in line
    assert "Comparison" in (tmp_path / "cmp" / "compare.html").read_text()
    missing = runner.invoke(app, ["evaluate", "--compare", str(tmp_path / "a"), str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "no metrics.json" in missing.output


def test_failed_rollouts_are_failed_samples(fake_server, tmp_path):
    env_file = tmp_path / "fragile.py"
    env_file.write_text(
        "from atropos_cli import SimpleEnv\n\n"
        "class Fragile(SimpleEnv):\n"
        "    name = 'fragile'\n"
        "    def items(self, split):\n"
        "        return iter([{'id': str(i), 'q': 'say a number'} for i in range(3)])\n"
        "    def prompt(self, item):\n"
        "        return item['q']\n"
        "    def reward(self, completion, item):\n"
        "        return 1.0 / (int(completion) - 2)\n"
    )
    server = fake_server(rule=["3", "2"])  # "2" makes the reward divide by zero
    out = tmp_path / "ev"
    result = runner.invoke(
        app, ["evaluate", str(env_file), "--out", str(out), "--openai.base_url", server.base_url, "--num-samples", "2"]
    )
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())["results"]["all"]
    assert metrics["failed_samples"] == 3 and metrics["pass@1"] == 0.5 and metrics["pass@2"] == 1.0
    failed = [s for s in read_jsonl(out / "samples.jsonl") if s.get("error")]
    assert len(failed) == 3 and all("ZeroDivisionError" in s["error"] for s in failed)
    assert len(read_jsonl(out / "failures.jsonl")) == 3


def test_unknown_env_and_bad_limit_are_reported(tmp_path):
    result = runner.invoke(app, ["evaluate", "gsm9k", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "unknown env 'gsm9k'" in result.output and "gsm8k" in result.output
    result = runner.invoke(app, ["evaluate", "arithmetic", "--limit", "0"])
    assert result.exit_code == 2


@pytest.mark.skipif("atropos-tiny-arith" not in shipped_models(), reason="the shipped model is not built here")
def test_evaluate_arithmetic_offline_on_the_shipped_model(tmp_path):
    out = tmp_path / "ev"
    result = runner.invoke(app, ["evaluate", "arithmetic", "--out", str(out), "--limit", "4", "--num-samples", "2"])
    assert result.exit_code == 0, result.output
    assert "local backend" in result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["config_general"]["model_name"] == "atropos-tiny-arith"
    assert metrics["results"]["all"]["num_samples"] == 8


def test_an_env_evaluate_override_adds_its_metrics(fake_server, tmp_path):
    env_file = tmp_path / "custom.py"
    env_file.write_text(
        "from atropos_cli import BaseEnv\n\n"
        "class OnlyEval(BaseEnv):\n"
        "    name = 'only_eval'\n"
        "    async def evaluate(self, *args, **kwargs):\n"
        "        reply = await self.server.chat_completion(messages=[{'role': 'user', 'content': 'hi'}])\n"
        "        return {'custom_accuracy': 1.0 if reply.choices[0].text == 'hello' else 0.0}\n"
    )
    server = fake_server(rule=["hello"])
    out = tmp_path / "ev"
    result = runner.invoke(app, ["evaluate", str(env_file), "--out", str(out), "--openai.base_url", server.base_url])
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())["results"]["all"]
    assert metrics["custom_accuracy"] == 1.0 and metrics["num_items"] == 0
    assert "custom_accuracy" in result.output
    assert "ran only_eval's own evaluate()" in result.output and "evaluated 0 items" not in result.output


def test_evaluate_gsm8k_on_a_local_file(fake_server, tmp_path):
    data = Path(__file__).parent / "data" / "gsm8k_tiny.jsonl"
    golds = {json.loads(line)["question"]: json.loads(line)["answer"].split("####")[-1].strip() for line in data.open()}

    def half_right(prompt: str, index: int) -> str:  # of each pair of samples, the first is right
        return f"\\boxed{{{golds[prompt]}}}" if index % 2 == 0 else "\\boxed{-1}"

    server = fake_server(rule=half_right)
    out = tmp_path / "eval-gsm8k"
    result = runner.invoke(
        app,
        ["evaluate", "gsm8k", "--openai.base_url", server.base_url, "--num-samples", "2", "--out", str(out),
         "--env.data_path", str(data)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())["results"]["atropos|gsm8k_eval|0"]
    assert metrics["num_items"] == 4 and metrics["pass@1"] == 0.5 and metrics["pass@2"] == 1.0
    assert metrics["pass@1_stderr"] == 0.0


def test_an_env_whose_evaluate_raises_is_one_line_naming_the_env_code(fake_server, tmp_path):
    env_file = tmp_path / "broken.py"
    env_file.write_text(
        "from atropos_cli import BaseEnv\n\n"
        "class Broken(BaseEnv):\n"
        "    name = 'broken'\n"
        "    async def evaluate(self, *args, **kwargs):\n"
        "        return {'accuracy': 1 / 0}\n"
    )
    server = fake_server(rule=["hello"])
    result = runner.invoke(
        app, ["evaluate", str(env_file), "--out", str(tmp_path / "ev"), "--openai.base_url", server.base_url]
    )
    assert result.exit_code != 0
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) <= 3, result.output
    assert "evaluate() raised ZeroDivisionError: division by zero" in result.output
    assert f"{env_file}:6" in result.output
