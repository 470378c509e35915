"""Render the tables of a benchmark run into docs/performance.md.

    python bench/render.py                          # bench/results/latest.json → docs/performance.md
    python bench/render.py bench/results/run-….json
    python bench/render.py bench/results/latest.json bench/results/compare-….json   # several runs
    python bench/render.py --check                  # exit 1 if the doc is not what the JSON renders

The doc marks where each table goes with a pair of comments, ``<!-- bench:KEY -->`` and
``<!-- /bench:KEY -->``; everything between them is replaced. ``KEY`` is a table's key (as printed
by ``bench/run.py`` and saved in the JSON), or ``run`` for the command, machine and load averages of
the run. A table no given run measured keeps what the doc has. The prose around the blocks is the
author's: after a new run, reread it against the figures.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, ROOT, fmt, numeric_columns  # noqa: E402

__all__ = ["markdown_table", "merge", "render", "render_text"]

DOC = ROOT / "docs" / "performance.md"
BLOCK = re.compile(r"(<!-- bench:(?P<key>[\w-]+) -->\n).*?(<!-- /bench:(?P=key) -->)", re.S)


def markdown_table(table: dict[str, Any]) -> str:
    numeric = numeric_columns(table["rows"], len(table["headers"]))
    lines = [
        "| " + " | ".join(table["headers"]) + " |",
        "|" + "|".join("---:" if num else "---" for num in numeric) + "|",
    ]
    lines += ["| " + " | ".join(fmt(cell) for cell in row) + " |" for row in table["rows"]]
    lines += [f"\n{note}" for note in table.get("notes", [])]
    return "\n".join(lines) + "\n"


def run_block(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        f"`{results.get('command', 'python bench/run.py')}`, {results.get('started', results.get('when'))}, "
        f"{results.get('minutes', '?')} minutes.",
        f"Machine: {m['cpus']} × {m['cpu']}, {m.get('memory_gib')} GiB, Linux {m.get('kernel')}, "
        f"Python {m['python']}.",
        "",
        "| benchmark | seconds | load average before (1, 5, 15 min) | after |",
        "|---|---:|---|---|",
    ]
    for bench in results.get("benches", []):
        lines.append(f"| {bench['name']} | {bench['seconds']} | {bench['load_before']} | {bench['load_after']} |")
    return "\n".join(lines) + "\n"


PLOT = DOC.parent / "performance-latency.svg"


def latency_plot(results: dict[str, Any], mode: str = "pinned") -> str | None:
    """An SVG of every system's tools/call latency in the run (``mode``), on a log scale: a line from
    the fastest call (or p10) to p99, a box from p25 to p75 where the run has them, a mark at p50."""
    import math

    rows: list[tuple[str, dict[str, float]]] = []
    for report in results["reports"]:
        for key in ("calls", "httpcalls"):
            if report.get("name") == key and mode in report.get("data", {}):
                for name, stats in report["data"][mode]["latency"].items():
                    rows.append((f"{name}" + (" (http bench)" if key == "httpcalls" and "socket" in name else ""), stats))
    if not rows:
        return None
    rows.sort(key=lambda row: row[1]["p50_us"])
    low = min(r[1].get("p10_us", r[1].get("min_us", r[1]["p50_us"])) for r in rows)
    high = max(r[1]["p99_us"] for r in rows)
    lo, hi = 10 ** math.floor(math.log10(max(low, 1))), 10 ** math.ceil(math.log10(high))
    left, width, row_h, top = 330, 560, 22, 40
    height = top + row_h * len(rows) + 50

    def x(us: float) -> float:
        return left + width * (math.log10(max(us, lo)) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 30}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<text x="10" y="20" font-size="14">tools/call latency, {mode} (µs, log scale): '
           f'line fastest/p10 to p99, box p25 to p75, mark p50</text>']
    decade = lo
    while decade <= hi:
        out.append(f'<line x1="{x(decade):.1f}" y1="{top - 5}" x2="{x(decade):.1f}" y2="{height - 40}" stroke="#ddd"/>')
        out.append(f'<text x="{x(decade):.1f}" y="{height - 25}" text-anchor="middle">{decade:,.0f}</text>')
        decade *= 10
    for i, (name, stats) in enumerate(rows):
        y = top + i * row_h + row_h / 2
        colour = "#1f77b4" if name.startswith("atomictoolsd") else ("#999" if name.startswith("floor") else "#d62728")
        start = stats.get("p10_us", stats.get("min_us", stats["p50_us"]))
        out.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">{_escape(name)}</text>')
        out.append(f'<line x1="{x(start):.1f}" y1="{y:.1f}" x2="{x(stats["p99_us"]):.1f}" y2="{y:.1f}" stroke="{colour}"/>')
        if "p25_us" in stats and "p75_us" in stats:
            out.append(f'<rect x="{x(stats["p25_us"]):.1f}" y="{y - 6:.1f}" width="{max(1.0, x(stats["p75_us"]) - x(stats["p25_us"])):.1f}" '
                       f'height="12" fill="{colour}" fill-opacity="0.35" stroke="{colour}"/>')
        out.append(f'<line x1="{x(stats["p50_us"]):.1f}" y1="{y - 8:.1f}" x2="{x(stats["p50_us"]):.1f}" y2="{y + 8:.1f}" '
                   f'stroke="{colour}" stroke-width="3"/>')
        out.append(f'<text x="{x(stats["p99_us"]) + 6:.1f}" y="{y + 4:.1f}" fill="#555">{stats["p50_us"]:,.0f}</text>')
    out.append(f'<text x="10" y="{height - 8}" fill="#555">blue: atomictoolsd; red: peers; grey: floors. '
               f'The number is the p50.</text>')
    return "\n".join(out) + "\n</svg>\n"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render_text(text: str, results: dict[str, Any]) -> tuple[str, list[str], list[str]]:
    """The doc with every block filled; the keys filled, and the tables the doc has no block for."""
    tables = {t["key"]: t for report in results["reports"] for t in report["tables"]}
    data = {report["name"]: report["data"] for report in results["reports"] if report.get("data")}
    if "targets" in tables and data:  # judged again by today's run.targets(), from the run's own figures
        from dataclasses import asdict

        from run import targets

        tables["targets"] = asdict(targets(data))
    filled: list[str] = []

    def fill(match: re.Match[str]) -> str:
        key = match["key"]
        if key == "run":
            body = run_block(results)
        elif key == "plot-latency":
            if latency_plot(results) is None:
                return match[0]
            body = f"![tools/call latency of every system in the run, pinned]({PLOT.name})\n"
        elif key in tables:
            body = markdown_table(tables[key])
        else:
            return match[0]  # this run did not measure it: keep what is there
        filled.append(key)
        return match[1] + body + match[3]

    rendered = BLOCK.sub(fill, text)
    return rendered, filled, sorted(set(tables) - set(filled))


def merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One result of several: the first run's description, every run's reports."""
    return {**runs[0], "reports": [report for run in runs for report in run["reports"]]}


def render(results: dict[str, Any], doc: Path = DOC) -> str:
    text, filled, missing = render_text(doc.read_text(), results)
    doc.write_text(text)
    plot = latency_plot(results)
    if plot is not None and "plot-latency" in filled:
        (doc.parent / PLOT.name).write_text(plot)
    message = f"rendered {', '.join(filled) or 'nothing'} into {doc}"
    if missing:
        message += f"; no block for {', '.join(missing)}"
    return message


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="*", type=Path, default=[RESULTS / "latest.json"],
                        help="result files; the first gives the run block, a later one's table wins")
    parser.add_argument("--doc", type=Path, default=DOC)
    parser.add_argument("--check", action="store_true", help="only check that the doc matches the results")
    args = parser.parse_args()
    results = merge([json.loads(path.read_text()) for path in args.results])
    if args.check:
        text = args.doc.read_text()
        rendered, _, _ = render_text(text, results)
        plot = latency_plot(results)
        stale_plot = plot is not None and "<!-- bench:plot-latency -->" in text and (
            not (args.doc.parent / PLOT.name).exists() or (args.doc.parent / PLOT.name).read_text() != plot)
        if rendered != text or stale_plot:
            names = " ".join(str(path) for path in args.results)
            print(f"{args.doc} does not show {names}: run python bench/render.py {names}")
            return 1
        return 0
    print(render(results, args.doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
