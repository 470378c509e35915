"""bench/render.py: the tables of a benchmark run go into docs/performance.md between their markers,
and nothing else in the doc changes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_render() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_render", BENCH / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_render"] = module
    spec.loader.exec_module(module)
    return module


RESULTS: dict[str, Any] = {
    "command": "python bench/run.py",
    "started": "2026-01-01 00:00:00 +0000",
    "minutes": 20.5,
    "machine": {"cpus": 2, "cpu": "Some CPU", "memory_gib": 24.0, "kernel": "6.1", "python": "3.11.7"},
    "benches": [{"name": "calls", "seconds": 300.0, "load_before": [0.1, 0.2, 0.3], "load_after": [1.0, 0.5, 0.4]}],
    "reports": [{"name": "calls", "data": {}, "tables": [
        {"key": "calls-latency", "title": "t", "headers": ["system", "mode", "p50 µs"],
         "rows": [["atomictoolsd", "pinned", 41.25], ["fastmcp", "pinned", 1019.0]], "notes": ["Two rounds."]},
        {"key": "calls-new", "title": "t", "headers": ["a"], "rows": [[1]], "notes": []},
    ]}],
}

DOC = """# Performance

Prose the author wrote, kept as it is.

<!-- bench:run -->
old run
<!-- /bench:run -->

<!-- bench:calls-latency -->
| old | table |
<!-- /bench:calls-latency -->

<!-- bench:scale-memory -->
a table this run did not measure
<!-- /bench:scale-memory -->
"""


def test_tables_fill_their_blocks_and_the_rest_of_the_doc_stays() -> None:
    render = load_render()
    text, filled, missing = render.render_text(DOC, RESULTS)
    assert filled == ["run", "calls-latency"]
    assert missing == ["calls-new"]  # measured, but the doc has no place for it yet
    assert "Prose the author wrote, kept as it is." in text
    assert "a table this run did not measure" in text
    assert "| old | table |" not in text and "old run" not in text
    assert "| system | mode | p50 µs |\n|---|---|---:|\n| atomictoolsd | pinned | 41.2 |\n| fastmcp | pinned | 1,019 |" in text
    assert "Two rounds." in text
    assert "`python bench/run.py`, 2026-01-01 00:00:00 +0000, 20.5 minutes." in text
    assert "| calls | 300.0 | [0.1, 0.2, 0.3] | [1.0, 0.5, 0.4] |" in text


def test_rendering_again_changes_nothing(tmp_path: Path) -> None:
    render = load_render()
    once, _, _ = render.render_text(DOC, RESULTS)
    twice, _, _ = render.render_text(once, RESULTS)
    assert twice == once


def test_the_latency_plot_is_rendered_from_the_run(tmp_path: Path) -> None:
    render = load_render()
    stats = {"p10_us": 60.0, "p25_us": 65.0, "p50_us": 70.0, "p75_us": 80.0, "p90_us": 90.0, "p99_us": 150.0, "min_us": 55.0}
    results = {**RESULTS, "reports": [
        {"name": "httpcalls", "tables": [], "data": {"pinned": {"latency": {
            "atomictoolsd, HTTP": stats, "fastmcp 4.1.0, HTTP": {**stats, "p50_us": 1500.0, "p99_us": 3000.0},
            "floor: uvicorn + httptools, canned answer": {**stats, "p50_us": 40.0}}}}},
        {"name": "calls", "tables": [], "data": {"pinned": {"latency": {
            "mcpserver (mcp 2.3.0), raw client, stdio": {"p50_us": 450.0, "p99_us": 700.0, "min_us": 400.0}}}}},
    ]}
    svg = render.latency_plot(results)
    assert svg is not None and svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    # Every system of the run, fastest first, each with its p50 written beside it.
    names = ["floor: uvicorn + httptools, canned answer", "atomictoolsd, HTTP", "mcpserver (mcp 2.3.0), raw client, stdio",
             "fastmcp 4.1.0, HTTP"]
    positions = [svg.index(f">{name}<") for name in names]
    assert positions == sorted(positions)
    for p50 in ("40", "70", "450", "1,500"):
        assert f">{p50}</text>" in svg
    doc = tmp_path / "performance.md"
    doc.write_text("# P\n\n<!-- bench:plot-latency -->\nold\n<!-- /bench:plot-latency -->\n")
    render.render(results, doc)
    assert "![tools/call latency" in doc.read_text() and (tmp_path / "performance-latency.svg").read_text() == svg
    assert render.latency_plot({**RESULTS, "reports": []}) is None
