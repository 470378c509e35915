"""Builds of several declarations that start together each find the installer. Finding uv reads
the interpreter's configuration (``sysconfig``), whose first read is not safe from two threads at
once: each build looking in a thread of its own saw ``EXE`` unset and failed with a TypeError. Run
in a fresh interpreter, where that configuration has not been read yet. Where atomictoolsd has no
uv, ``auto`` builds with pip, from a real index of the test's own."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent('''
    import asyncio, sys
    from pathlib import Path
    from atomictoolsd.config.settings import Config
    from atomictoolsd.environments.script import ScriptMetadata
    from atomictoolsd.environments.store import Environments
    from atomictoolsd.protocol import LoadFailure

    root = Path(sys.argv[1])
    # An index that is not there: each build finds its installer, then fails to resolve, quickly.
    store = Environments(root / "envs", root, Config(package_index=(root / "no-index").as_uri(), install_timeout=60))

    async def build(n):
        try:
            await store.declared(f"m{n}.py", ScriptMetadata((f"atomictools-test-pkg{n}",), None, 1))
        except LoadFailure as failure:
            return failure.info["message"]
        return "built"

    async def main():
        for message in await asyncio.gather(*(build(n) for n in range(4))):
            print(message.replace("\\n", " ")[:300])

    asyncio.run(main())
''')


def test_builds_starting_together_each_find_the_installer(tmp_path: Path) -> None:
    pytest.importorskip("uv")
    done = subprocess.run(
        [sys.executable, "-I", "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    messages = done.stdout.splitlines()
    assert len(messages) == 4
    for n, message in enumerate(messages):
        # The installer ran and said why it could not resolve: no error of finding it.
        assert message.startswith(f"cannot install the dependencies it declares (atomictools-test-pkg{n}): "), message
        assert "TypeError" not in message and "no installer" not in message


WITHOUT_UV = textwrap.dedent('''
    import asyncio, json, sys
    sys.modules["uv"] = None  # atomictoolsd's environment without the uv package
    from pathlib import Path
    from atomictoolsd.config.settings import Config
    from atomictoolsd.environments.script import ScriptMetadata
    from atomictoolsd.environments.store import Environments
    from atomictoolsd.protocol import LoadFailure

    root, index = Path(sys.argv[1]), sys.argv[2]

    async def build(choice):
        store = Environments(root / choice, root, Config(package_index=index, installer=choice, install_timeout=60))
        try:
            env = await store.declared("m.py", ScriptMetadata(("plainpkg",), None, 1))
        except LoadFailure as failure:
            return {"error": failure.info["message"]}
        return json.loads((Path(env.site[0]) / ".atomic-env.json").read_text())

    print(json.dumps([asyncio.run(build(choice)) for choice in ("auto", "uv")]))
''')


def test_without_uv_auto_installs_with_pip_and_uv_chosen_says_where_to_get_it(tmp_path: Path) -> None:
    pytest.importorskip("pip")
    from wheelhouse import Index, make_wheel

    make_wheel(tmp_path, "plainpkg", "1.0", "VALUE = 1\n")
    index = Index(tmp_path)
    try:
        done = subprocess.run(  # a home with no ~/.local/bin/uv: uv is nowhere
            [sys.executable, "-I", "-c", WITHOUT_UV, str(tmp_path), index.url], capture_output=True, text=True,
            timeout=120, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        )
    finally:
        index.close()
    assert done.returncode == 0, done.stderr
    auto, chosen = json.loads(done.stdout)
    assert auto.get("installer") == "pip" and auto["packages"] == ["plainpkg==1.0"], auto
    assert chosen["error"] == (
        "cannot install the dependencies it declares (plainpkg): installer = \"uv\", but atomictoolsd finds no uv "
        "(pip install uv in its environment)")
