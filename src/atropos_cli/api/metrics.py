"""Counters of the trajectory API and their Prometheus text rendering (`GET /metrics`), plus recent rates.

`service.py` bumps the counters; `app.py` serves `render()`; the CLI's status line reads `rates()`. Queue depth
gauges are computed from the live queue at scrape time, so they are never stale.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field

__all__ = ["ApiMetrics", "QueueGauges"]


@dataclass
class QueueGauges:
    """A point-in-time view of the queue, per env (None = groups posted without a registered env)."""

    step: int
    groups: dict[str, int]
    sequences: dict[str, int]
    buffered_groups: int
    pending_batches: int


@dataclass
class ApiMetrics:
    ingested_groups: Counter[str] = field(default_factory=Counter)
    ingested_sequences: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    batches_served: int = 0
    sequences_served: int = 0
    # (monotonic time, groups in, sequences out) events for recent rates; bounded.
    _events: deque[tuple[float, int, int]] = field(default_factory=lambda: deque(maxlen=100_000))

    def on_ingest(self, env: str, groups: int, sequences: int) -> None:
        self.ingested_groups[env] += groups
        self.ingested_sequences[env] += sequences
        self._events.append((time.monotonic(), groups, 0))

    def on_reject(self, reason: str) -> None:
        self.rejected[reason] += 1

    def on_batch(self, sequences: int) -> None:
        self.batches_served += 1
        self.sequences_served += sequences
        self._events.append((time.monotonic(), 0, sequences))

    def rates(self, window_s: float = 10.0) -> tuple[float, float]:
        """(groups/s in, sequences/s out) over the last `window_s` seconds."""
        cutoff = time.monotonic() - window_s
        while self._events and self._events[0][0] < cutoff:
            self._events.popleft()
        groups = sum(e[1] for e in self._events)
        seqs = sum(e[2] for e in self._events)
        return groups / window_s, seqs / window_s

    def render(self, gauges: QueueGauges) -> str:
        """The Prometheus text exposition: one family per metric, one sample per env or reason."""
        groups_rate, seqs_rate = self.rates()
        rejected: dict[str, float] = {f'reason="{_esc(r)}"': n for r, n in self.rejected.items()}
        families: list[tuple[str, str, str, dict[str, float]]] = [
            ("atropos_api_step", "gauge", "Trainer step (batches formed).", {"": gauges.step}),
            ("atropos_api_queue_groups", "gauge", "Queued groups per env.", _by_env(gauges.groups)),
            ("atropos_api_queue_sequences", "gauge", "Queued sequences per env.", _by_env(gauges.sequences)),
            ("atropos_api_buffered_groups", "gauge", "Mixed-size groups waiting in env buffers.",
             {"": gauges.buffered_groups}),
            ("atropos_api_pending_batches", "gauge", "Batches formed but not yet served.",
             {"": gauges.pending_batches}),
            ("atropos_api_ingested_groups_total", "counter", "Groups accepted.", _by_env(self.ingested_groups)),
            ("atropos_api_ingested_sequences_total", "counter", "Sequences accepted.",
             _by_env(self.ingested_sequences)),
            ("atropos_api_rejected_groups_total", "counter", "Requests rejected, by reason.", rejected),
            ("atropos_api_batches_served_total", "counter", "Batches served.", {"": self.batches_served}),
            ("atropos_api_sequences_served_total", "counter", "Sequences served.", {"": self.sequences_served}),
            ("atropos_api_ingest_groups_per_second", "gauge", "Groups accepted per second (10 s window).",
             {"": groups_rate}),
            ("atropos_api_served_sequences_per_second", "gauge", "Sequences served per second (10 s window).",
             {"": seqs_rate}),
        ]  # fmt: skip
        lines: list[str] = []
        for name, kind, help_text, samples in families:
            _family(lines, name, kind, help_text, samples)
        return "\n".join(lines) + "\n"


def _by_env(values: dict[str, int] | Counter[str]) -> dict[str, float]:
    return {f'env="{_esc(env)}"': n for env, n in values.items()}


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _family(lines: list[str], name: str, kind: str, help_text: str, samples: dict[str, float]) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    for labels, value in samples.items():
        text = str(value) if isinstance(value, int) else f"{value:.6g}"
        lines.append(f"{name}{{{labels}}} {text}" if labels else f"{name} {text}")
