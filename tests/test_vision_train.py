"""`atropos train` on Atropos' multimodal env file clevr_complex.py (atroposlib 0.4.0's sdist, unmodified; its
dataset replaced by tests/atropos_corpus_data.py's stand-in rows of tiny PNGs) with a tiny Qwen2.5-VL of random
weights: the images go through the local backend's processor in rollouts and reach the policy's forward in the
trainer (`image_rows` in metrics.jsonl), then the saved rollouts (images and all) train again from the file, with
LoRA and full fine-tuning from the run's checkpoint, with a gradient."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")

from atropos_cli.families_vl import save_tiny  # noqa: E402
from atropos_corpus_data import install  # noqa: E402
from test_atropos_corpus import sdist_root  # noqa: E402


@pytest.fixture
def standins(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", datasets.load_dataset)  # restored after the test
    install()


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_train_on_clevr_complex_with_a_vision_language_model(tmp_path: Path, standins: None) -> None:
    from typer.testing import CliRunner

    from atropos_cli.cli.app import app

    env_file = sdist_root() / "environments" / "multimodal_dpo" / "clevr_complex.py"
    model = save_tiny(tmp_path / "tiny-vl")
    out = tmp_path / "run"
    args = ["train", str(env_file), "--model", str(model), "--out", str(out), "--steps", "2", "--groups-per-step", "1"]
    # a random model never answers right: every score is -1, kept (the env would drop such groups)
    args += ["--env.group_size", "4", "--env.ensure_scores_are_not_same", "false", "--save-rollouts"]
    result = CliRunner().invoke(app, [*args, "--save-every", "0"])
    assert result.exit_code == 0, result.output
    assert "trained 2 steps" in result.output
    assert "the static engine refuses this model (a vision-language model" in result.output  # the path, said
    steps = _metrics(out)
    assert [m["image_rows"] for m in steps] == [4, 4] and all(math.isfinite(m["loss"]) for m in steps)
    groups = [json.loads(line) for line in (out / "trained_rollouts.jsonl").read_text().splitlines()]
    assert len(groups) == 2 and all(len(g["images"]) == 4 for g in groups)

    # the same rows from the file, with scores that carry signal, from the run's checkpoint (saved with its image
    # processor: it loads as the model it came from), LoRA and full fine-tuning: the gradient is not zero
    data = tmp_path / "rollouts.jsonl"
    for g in groups:
        g["scores"] = [1.0, -1.0, 1.0, -1.0]
    data.write_text("".join(json.dumps(g) + "\n" for g in groups))
    checkpoint = out / "checkpoints" / "step-2"
    for name, extra in (("lora", ["--lora-r", "4"]), ("full", [])):
        again = tmp_path / name
        args = ["train", "--data", str(data), "--model", str(checkpoint), "--out", str(again), "--steps", "1"]
        result = CliRunner().invoke(app, [*args, "--groups-per-step", "2", "--lr", "1e-3", *extra])
        assert result.exit_code == 0, result.output
        (step,) = _metrics(again)
        assert step["image_rows"] == 8 and step["grad_norm"] > 0 and math.isfinite(step["loss"]), name


def test_image_rows_for_a_text_only_model_are_one_error(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from atropos_cli.cli.app import app

    row = {"tokens": [[1, 2, 3, 4]] * 2, "masks": [[-100, -100, 3, 4]] * 2, "scores": [1.0, 0.0]}
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({**row, "images": ["aGk=", None]}) + "\n")
    args = ["train", "--data", str(data), "--model", "atropos-tiny-arith", "--out", str(tmp_path / "o"), "--steps", "1"]
    result = CliRunner().invoke(app, [*args, "--groups-per-step", "1"])
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert lines == ["error: model 'atropos-tiny-arith' reads text only; the batch has 1 rollout(s) with images"]
    assert "Traceback" not in result.output and "hint:" in result.output


@pytest.mark.slow  # clevr_complex.py above covers the path in CI; these are the other multimodal env files
@pytest.mark.parametrize("name", ["ocr_vqa", "pixmo_clocks", "pixmo_count", "pixmo_point_explanations"])
def test_train_on_the_other_multimodal_env_files(name: str, tmp_path: Path, standins: None) -> None:
    from typer.testing import CliRunner

    from atropos_cli.cli.app import app

    env_file = sdist_root() / "environments" / "multimodal_dpo" / f"{name}.py"
    model = save_tiny(tmp_path / "tiny-vl")
    args = ["train", str(env_file), "--model", str(model), "--out", str(tmp_path / "run"), "--steps", "1"]
    args += ["--groups-per-step", "1", "--env.group_size", "4", "--env.ensure_scores_are_not_same", "false"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert [m["image_rows"] for m in _metrics(tmp_path / "run")] == [4]
