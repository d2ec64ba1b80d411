"""atroposlib.frontend.jsonl2html: `generate_html(path)` renders a groups jsonl as our HTML viewer beside it."""

from __future__ import annotations

from pathlib import Path

__all__ = ["generate_html"]


def generate_html(path: str | None, output_path: str | None = None) -> str | None:
    if path is None or not Path(path).is_file():
        return None
    from atropos_cli.formats.html import render_html
    from atropos_cli.formats.reader import iter_groups

    out = Path(output_path) if output_path else Path(path).with_suffix(".html")
    render_html(iter_groups([Path(path)]), out, title=f"atropos groups: {path}")
    return str(out)
