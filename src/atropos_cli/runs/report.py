"""The eval HTML report: metrics.json + samples.jsonl (+ an optional comparison) -> DIR/report.html.

One self-contained page (inline CSS, no script, no network) rendered from templates/eval_report.html.j2
with the same Jinja settings as the rollout viewer (autoescape on, strict undefined), so model output in a
sample is always shown as text. Samples are listed failures first, then wrong, then right, capped at
MAX_SAMPLES so a 10,000-sample eval still opens quickly.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from atropos_cli.formats.html import load_template
from atropos_cli.runs.metrics import MetricDelta

__all__ = ["render_eval_report", "MAX_SAMPLES"]

TEMPLATE = "eval_report.html.j2"
MAX_SAMPLES = 300


def _metric_rows(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, value in metrics.items():
        if name.endswith("_stderr"):
            continue
        rows.append({"name": name, "value": value, "stderr": metrics.get(f"{name}_stderr")})
    return rows


def render_eval_report(
    out_path: Path,
    document: dict[str, Any],
    samples: list[Any],
    compare: tuple[str, str, list[MetricDelta]] | None = None,
) -> Path:
    """Write the report; `compare` = (label A, label B, deltas) adds a comparison table."""
    ordered = sorted(samples, key=lambda s: (s.error is None, s.correct, s.index, s.sample))
    html = load_template(TEMPLATE).render(
        title=f"atropos eval: {document['config_general'].get('env')}",
        general=document["config_general"],
        metrics=_metric_rows(document["results"]["all"]),
        compare=compare,
        samples=ordered[:MAX_SAMPLES],
        total_samples=len(samples),
        generated=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    )
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(out_path)
    return out_path
