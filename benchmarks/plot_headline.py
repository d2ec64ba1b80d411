"""Draw docs/assets/headline.png from the README's headline table (## Benchmarks): one bar a row, ours / peer.

    python benchmarks/plot_headline.py [--readme README.md] [--out docs/assets/headline.png]

The table is the one source: its "ours / peer" column (e.g. `3.1×`, `6.6× faster`) is the bar, its "what" and
"machine" columns the label. Needs matplotlib (the `plot` extra).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def headline_rows(readme: str) -> list[tuple[str, float, str]]:
    """(what, ratio, machine) for each row of the table under `## Benchmarks`."""
    section = readme.split("\n## Benchmarks\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    what, ratio, machine = header.index("what"), header.index("ours / peer"), header.index("machine")
    rows = []
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        number = re.match(r"([\d.]+)×", cells[ratio])
        if number is None:
            raise SystemExit(f"error: headline row {cells[what]!r}: cannot read a ratio from {cells[ratio]!r}")
        rows.append((cells[what], float(number.group(1)), cells[machine]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "assets" / "headline.png")
    args = parser.parse_args()
    rows = headline_rows(args.readme.read_text())

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{what.replace(chr(96), '')}\n({machine})" for what, _, machine in rows]
    ratios = [ratio for _, ratio, _ in rows]
    fig, ax = plt.subplots(figsize=(9, 0.75 * len(rows) + 1.2))
    bars = ax.barh(range(len(rows)), ratios, color="#3b7dd8")
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("ours / peer, same machine, same run (log scale; 1 = even)")
    for bar, ratio in zip(bars, ratios, strict=True):
        ax.text(bar.get_width() * 1.05, bar.get_y() + bar.get_height() / 2, f"{ratio:g}×", va="center", fontsize=8)
    ax.set_xlim(0.8, max(ratios) * 2)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
