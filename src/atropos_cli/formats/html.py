"""The HTML viewer: scored groups -> ONE self-contained, offline HTML file (inline CSS and JS, no CDN).

Flow: `atropos process` calls `render_html` at the end of a run (RUN/index.html); `atropos view` calls it for
any groups file or several runs. The page has a static header rendered by Jinja (run stats and a score
histogram as inline SVG) and a client-side list of group cards: the groups are embedded once as JSON in a
`<script type="application/json">` block and rendered PAGE_SIZE (100) groups at a time, so 10,000 groups stay
fast, with text search, a mean-score filter, a source filter and keyboard navigation.

Safety: Jinja autoescape is on, and model output reaches the page only as data: in the JSON block every
`<`, `>` and `&` is written as a \\u escape (nothing in it can close the script tag), and the page's script
puts text in the DOM with `textContent`, never `innerHTML`. A completion containing `</script>` renders as
text.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from atropos_cli.formats.jsonl import dumps_compact
from atropos_cli.formats.reader import BadRecord, SourcedGroup
from atropos_cli.formats.text import content_text
from atropos_cli.types import ScoredGroup

__all__ = ["render_html", "PAGE_SIZE", "source_label", "embed_json", "run_decoder", "names_decoder", "Decoder"]

Decoder = Callable[[list[int]], "str | None"]

PAGE_SIZE = 100
HISTOGRAM_BINS = 20
TEMPLATE = "viewer.html.j2"
_RUN_FILE_NAMES = ("groups.jsonl", "groups.parquet")


def source_label(source: str) -> str:
    """How a source is named in the page: a run's groups file is named by its run directory."""
    path = Path(source)
    return str(path.parent) if path.name in _RUN_FILE_NAMES else str(path)


def embed_json(data: Any) -> str:
    """JSON that is safe inside a `<script type="application/json">` element (no `<`, `>`, `&` left)."""
    # dumps_compact already escapes U+2028/2029 and lone surrogates; the tag-closing characters go here.
    text = dumps_compact(data)
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(raw, escaped)
    return text


def _message_row(message: dict[str, Any]) -> list[Any]:
    """[role, text] or [role, text, extra-keys JSON] for one message."""
    row: list[Any] = [str(message.get("role", "?")), content_text(message)]
    skip = {"role", "content"}
    if message.get("content") is None:
        skip.add("tool_calls")  # already shown as the message text
    extra = {k: v for k, v in message.items() if k not in skip}
    if extra:
        row.append(json.dumps(extra, ensure_ascii=False, default=str))
    return row


def run_decoder(config_path: Path) -> Decoder | None:
    """The tokenizer of a run (its config.yaml: env.tokenizer_name, else a local server's model) as a
    decoder; None when the run names none or it cannot be loaded (the page then shows token ids)."""
    import yaml

    try:
        config = yaml.safe_load(Path(config_path).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    servers = config.get("openai") or []
    found = [(config.get("env") or {}).get("tokenizer_name"), *(s.get("tokenizer_name") for s in servers)]
    found += [s.get("model_name") for s in servers if s.get("server_type") == "local"]
    return names_decoder(found)


def names_decoder(candidates: list[Any]) -> Decoder | None:
    """A decoder by the first of `candidates` (tokenizer names) that loads, loaded on first use (pages whose
    groups all have messages never need it); None when there is no name."""
    from atropos_cli.errors import AtroposError
    from atropos_cli.inference.tokenizer import load_tokenizer

    names: list[str] = [n for n in candidates if isinstance(n, str) and n and n != "none"]
    loaded: list[Any] = []

    def decode(ids: list[int]) -> str | None:
        while not loaded and names:
            try:
                loaded.append(load_tokenizer(names.pop(0)))
            except AtroposError:
                continue
        return loaded[0].decode(ids) if loaded else None

    return decode if names else None


def _common_prefix(chats: list[list[dict[str, Any]]]) -> int:
    """How many leading messages every rollout shares (the prompt, shown once per group)."""
    shortest = min(len(chat) for chat in chats)
    count = 0
    while count < shortest and all(chat[count] == chats[0][count] for chat in chats[1:]):
        count += 1
    # Keep at least one message per rollout, so a rollout never renders empty.
    return min(count, max(shortest - 1, 0))


def _completion_tokens(group: ScoredGroup, j: int) -> int | None:
    rollouts = group.meta.rollouts if group.meta is not None else None
    if rollouts is not None and rollouts[j].completion_tokens is not None:
        return rollouts[j].completion_tokens
    if group.masks and j < len(group.masks):
        return sum(1 for m in group.masks[j] if m != -100)
    return None


def _token_rows(group: ScoredGroup, j: int, decode: Decoder | None) -> list[list[Any]] | None:
    """A rollout with tokens but no messages (a ported env's group): its decoded text, prompt and completion
    apart (masks tell them), or its token ids when there is no tokenizer."""
    if not group.tokens or j >= len(group.tokens):
        return None
    tokens, masks = group.tokens[j], group.masks[j] if group.masks else []
    start = next((i for i, m in enumerate(masks) if m != -100), len(tokens))
    completion = decode(tokens[start:]) if decode is not None else None
    if completion is None:
        return [["token ids", " ".join(map(str, tokens))]]
    rows = [["prompt (decoded tokens)", decode(tokens[:start])]] if start and decode else []
    return rows + [["completion (decoded tokens)", completion]]


def _rollout(group: ScoredGroup, j: int, skip: int, decode: Decoder | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"sc": group.scores[j]}
    if group.messages is not None:
        out["m"] = [_message_row(m) for m in group.messages[j][skip:]]
    elif (rows := _token_rows(group, j, decode)) is not None:
        out["m"] = rows
    rollouts = group.meta.rollouts if group.meta is not None else None
    if rollouts is not None:
        if rollouts[j].finish_reason is not None:
            out["fr"] = rollouts[j].finish_reason
        if rollouts[j].reward_parts:
            out["p"] = rollouts[j].reward_parts
    tokens = _completion_tokens(group, j)
    if tokens is not None:
        out["nt"] = tokens
    return out


def group_payload(sourced: SourcedGroup, source_index: int, decode: Decoder | None = None) -> dict[str, Any]:
    """The compact dict the page's script renders one card from."""
    group = sourced.group
    skip = _common_prefix(group.messages) if group.messages else 0
    out: dict[str, Any] = {"s": source_index, "i": sourced.index, "mean": sum(group.scores) / group.size}
    if skip and group.messages:
        out["pm"] = [_message_row(m) for m in group.messages[0][:skip]]
    meta = group.meta
    if meta is not None:
        for key, value in (("id", meta.group_id), ("env", meta.env), ("item", meta.item_id), ("model", meta.model)):
            if value is not None:
                out[key] = value
        if meta.failed_rollouts:
            out["failed"] = meta.failed_rollouts
    out["r"] = [_rollout(group, j, skip, decode) for j in range(group.size)]
    return out


def _histogram(scores: list[float]) -> list[dict[str, Any]]:
    """Bars for the header's SVG: count, height (0..1), sign of the bin's centre and its range label."""
    if not scores:
        return []
    low, high = min(scores), max(scores)
    bins = 1 if high == low else HISTOGRAM_BINS
    width = (high - low) / bins or 1.0
    counts = [0] * bins
    for score in scores:
        counts[min(int((score - low) / width), bins - 1)] += 1
    tallest = max(counts)
    bars = []
    for k, count in enumerate(counts):
        start = low + k * width
        end = high if k == bins - 1 else start + width
        # A bin that holds 0 is amber (zero); the others take the colour of their side.
        sign = "zero" if start <= 0 <= end else "pos" if start > 0 else "neg"
        bars.append(
            {
                "count": count,
                "height": count / tallest,
                "sign": sign,
                "label": f"{low:g}" if bins == 1 else f"{start:.3g} to {end:.3g}",
            }
        )
    return bars


def _stats(groups: list[dict[str, Any]], scores: list[float], failures: int, bad: int) -> dict[str, Any]:
    mean = sum(scores) / len(scores) if scores else math.nan
    return {
        "groups": len(groups),
        "rollouts": len(scores),
        "mean": "n/a" if not scores else f"{mean:.4g}",
        "min": "n/a" if not scores else f"{min(scores):.4g}",
        "max": "n/a" if not scores else f"{max(scores):.4g}",
        "failures": failures,
        "bad": bad,
        "histogram": _histogram(scores),
    }


def render_html(
    groups: Iterable[SourcedGroup],
    out_path: Path,
    *,
    title: str,
    failures: int = 0,
    bad_records: Sequence[BadRecord] = (),
    decode: Decoder | None = None,
) -> Path:
    """Write the viewer for `groups` to `out_path` (parent dirs created) and return the path.

    `failures` is the run's failed-rollout count (failures.jsonl) and `bad_records` the lines skipped while
    reading; both are shown in the header. `bad_records` is read after `groups` is consumed, so the list an
    `iter_groups(..., on_bad=bad.append)` fills while this function reads can be passed as is. The page
    lists PAGE_SIZE groups at a time. `decode` (token ids -> text, e.g. `run_decoder(config.yaml)`) shows the
    rollouts that have tokens but no messages; without it they show their token ids.
    """
    sources: dict[str, int] = {}
    payload: list[dict[str, Any]] = []
    scores: list[float] = []
    for sourced in groups:
        index = sources.setdefault(sourced.source, len(sources))
        payload.append(group_payload(sourced, index, decode))
        scores.extend(sourced.group.scores)
    labels = [source_label(s) for s in sources]
    data = {
        "sources": labels,
        "maxAbs": max((abs(s) for s in scores), default=0.0),
        "pageSize": PAGE_SIZE,
        "groups": payload,
    }
    bad_list = list(bad_records)
    html = load_template().render(
        title=title,
        stats=_stats(payload, scores, failures, len(bad_list)),
        sources=labels,
        bad_records=bad_list[:20],
        page_size=PAGE_SIZE,
        generated=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        data_json=embed_json(data),
    )
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(out_path)  # a reader (or `view --serve`) never sees a half-written page
    return out_path


def load_template(name: str = TEMPLATE) -> Any:
    """A template from the bundled templates/ folder, in the one Jinja environment (autoescape on) of our pages."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    from atropos_cli.resources import templates_dir

    env = Environment(
        loader=FileSystemLoader(templates_dir()),
        autoescape=True,
        undefined=StrictUndefined,
        keep_trailing_newline=True,
    )
    return env.get_template(name)
