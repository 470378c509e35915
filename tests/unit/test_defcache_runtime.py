"""The definition cache's runtime version: whatever besides a module's own file shapes its
definitions must change it, or a daemon upgraded in place would list stale tools."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import atomictools
import atomictoolsd

CLIENT_SRC = Path(atomictools.__file__).parent
DAEMON_SRC = Path(atomictoolsd.__file__).parent


def runtime_version(*path: Path) -> str:
    """``runtime_version()`` in a fresh interpreter whose imports come first from ``path``."""
    out = subprocess.run(
        [sys.executable, "-c", "from atomictoolsd.registry.cache import runtime_version; print(runtime_version())"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in path)},
        capture_output=True, text=True, check=True, timeout=60,
    )
    return out.stdout.strip()


def copy_sources(to: Path) -> tuple[Path, Path]:
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(CLIENT_SRC, to / "client" / "atomictools", ignore=ignore)
    shutil.copytree(DAEMON_SRC, to / "daemon" / "atomictoolsd", ignore=ignore)
    return to / "client", to / "daemon"


def test_an_edit_to_the_declarative_loader_changes_the_runtime_version(tmp_path: Path) -> None:
    client, daemon = copy_sources(tmp_path)
    before = runtime_version(client, daemon)
    assert runtime_version(client, daemon) == before  # the same code: the same version
    for name in ("loader.py", "validation.py"):
        with open(daemon / "atomictoolsd" / "worker" / "declarative" / name, "a") as f:
            f.write("\n# an upgrade that changes which JSON tools load\n")
        after = runtime_version(client, daemon)
        assert after != before, name
        before = after


def test_another_fastjsonschema_changes_the_runtime_version(tmp_path: Path) -> None:
    client, daemon = copy_sources(tmp_path)
    installed = runtime_version(client, daemon)
    other = tmp_path / "other"
    (other / "fastjsonschema").mkdir(parents=True)
    (other / "fastjsonschema" / "__init__.py").write_text("VERSION = '0.0.1'\n")
    assert runtime_version(other, client, daemon) != installed
