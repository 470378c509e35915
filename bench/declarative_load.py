"""What declarative (JSON) tool files cost to load, and where the schema library's import is paid.

    python bench/declarative_load.py [--rounds 20]

Prints medians of:
- importing each candidate schema library in a fresh interpreter that already has the worker runtime
  (what a worker would pay if it imported the library itself);
- loading a JSON tool file (3 tools, one per handler type) through the real fork server: the first
  load of the daemon's life (the fork server imports the declarative package before that fork),
  then reloads (forked warm), against a Python module of three tools for comparison.

No assertion: the figures go into docs/declarative.md, measured on the machine at hand.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOOLBOX = Path(__file__).resolve().parents[1] / "examples" / "tools" / "toolbox.json"
PYTHON_MODULE = '''
from atomictools import tool

@tool
def a(x: int) -> int:
    return x

@tool
def b(s: str) -> str:
    return s

@tool
def c() -> str:
    return "c"
'''


def import_ms(module: str, runs: int = 5) -> float:
    code = (
        "import time, importlib, atomictoolsd.worker.main\n"
        f"t = time.perf_counter(); importlib.import_module({module!r}); print((time.perf_counter() - t) * 1000)"
    )
    samples = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if out.returncode != 0:
            return float("nan")
        samples.append(float(out.stdout.strip()))
    return statistics.median(samples)


async def load_times(rounds: int) -> dict[str, float]:
    from atomictoolsd.pool.pool import PoolSettings, WorkerPool

    directory = Path(tempfile.mkdtemp(prefix="bench-decl-"))
    (directory / "docs").mkdir()
    json_path = directory / "toolbox.json"
    json_path.write_text(TOOLBOX.read_text())
    py_path = directory / "three.py"
    py_path.write_text(PYTHON_MODULE)
    pool = WorkerPool(PoolSettings.from_config())
    out: dict[str, float] = {}
    try:
        async def once(path: Path, kind: str) -> float:
            runner = pool.runner(str(path), kind, str(directory))
            started = time.perf_counter()
            worker, definitions, _load_ms = await runner.load()
            took = (time.perf_counter() - started) * 1000
            assert len(definitions) == 3, definitions
            worker.close()
            return took

        await once(py_path, "python")  # start the fork server outside every figure
        out["first JSON load (fork server imports the declarative package)"] = await once(json_path, "declarative")
        out["JSON reload, forked warm (median)"] = statistics.median([await once(json_path, "declarative") for _ in range(rounds)])
        out["Python module of 3 tools, reload (median)"] = statistics.median([await once(py_path, "python") for _ in range(rounds)])
    finally:
        await pool.close()
        shutil.rmtree(directory, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    imports = {
        "import fastjsonschema": import_ms("fastjsonschema"),
        "import jsonschema": import_ms("jsonschema"),
        "import atomictoolsd.worker.declarative (all handlers + fastjsonschema)": import_ms("atomictoolsd.worker.declarative"),
    }
    loads = asyncio.run(load_times(args.rounds))
    width = max(map(len, [*imports, *loads]))
    print(f"python {sys.version.split()[0]} on {sys.platform}")
    for name, ms in {**imports, **loads}.items():
        print(f"{name.ljust(width)}  {ms:8.2f} ms")
    print(json.dumps({**imports, **loads}))


if __name__ == "__main__":
    main()
