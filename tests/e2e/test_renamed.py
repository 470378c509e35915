"""The keys renamed in 0.2 (docs/protocol.md#renamed): every result carries the new name and, until
0.3, the old one beside it with the same value; the docs list exactly the table the code uses."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from atomictools._protocol import RENAMED, read_renamed
from helpers import Env, RawConnection

PROTOCOL_MD = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
GREET = "from atomictools import tool\n\n@tool\ndef greet(name: str) -> str:\n    return name\n"


def test_the_docs_list_exactly_the_renamed_keys() -> None:
    section = PROTOCOL_MD.split("\n## Renamed\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `?([^|`]+?)`? \| `(\w+)` \| `(\w+)` \|$", section, re.MULTILINE)
    documented = {(where.replace("`", ""), old, new) for where, old, new in rows}
    assert documented == {(where, old, new) for where, renames in RENAMED.items() for old, new in renames.items()}
    assert all(re.fullmatch(r"[a-z][a-zA-Z0-9]*", new) for renames in RENAMED.values() for new in renames.values())


def both(entry: dict[str, Any], where: str) -> set[str]:
    """The renamed keys ``entry`` has, each checked to carry its old name with the same value."""
    found = set()
    for old, new in RENAMED[where].items():
        if new in entry:
            assert entry.get(old, "missing") == entry[new], (where, old, new, entry)
            found.add(new)
        assert not (old in entry and new not in entry), f"{where}: only the old {old!r}"
    return found


def test_each_result_carries_the_new_and_the_old_names(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    shared = env.root / "shared"
    env.write_tool(env.global_tools, "greet.py", GREET)
    env.write_tool(shared / ".atomic" / "tools", "greet.py", GREET)  # trusted: shadows the global greet
    env.write_tool(env.local_tools, "greet.py", GREET)  # untrusted: blocked
    env.set_trust_all(False)
    subprocess.run([sys.executable, "-m", "atomictoolsd", "trust", "--yes", str(shared)], env=env.vars, check=True,
                   capture_output=True)
    daemon = make_daemon()
    with RawConnection(env.socket) as raw:
        attach = raw.request("atomic/attach", {"directory": str(env.project)})["result"]
        assert both(attach["blocked"][0], "blocked[] of atomic/attach, atomic/list, atomic/reload") == {"fullCommand"}
        reload = raw.request("atomic/reload")["result"]
        assert both(reload["blocked"][0], "blocked[] of atomic/attach, atomic/list, atomic/reload") == {"fullCommand"}
        raw.request("atomic/attach", {"directory": str(shared)})
        assert raw.request("tools/call", {"name": "greet", "arguments": {"name": "x"}})["result"]["content"]
        listing = raw.request("atomic/list", {"all": True})["result"]
        where = "atomic/list tools[] and shadowed[], shadowedBy"
        assert both(listing["tools"][0], where) == {"scope"} and listing["tools"][0]["scope"] == "local"
        (shadowed,) = listing["shadowed"]
        assert both(shadowed, where) == {"scope"} and shadowed["scope"] == "global"
        assert both(shadowed["shadowedBy"], where) == {"scope"} and shadowed["shadowedBy"]["scope"] == "local"
        raw.request("atomic/bridges/create", {"agent": "claude", "ownerPid": daemon.pid})
        status = raw.request("atomic/status")["result"]
    assert both(status, "atomic/status") == {"configSources", "configFile"}
    module = next(m for m in status["modules"] if m["path"].startswith(str(shared)))
    assert both(module, "atomic/status modules[]") >= {
        "definitionsFrom", "failedCalls", "workerState", "lastError", "retryIn", "p50Ms", "p99Ms", "loadMs", "starting",
    }
    assert module["definitionsFrom"] == "worker" and module["failedCalls"] == 0 and module["p50Ms"] is not None
    blocked = next(m for m in status["modules"] if m["path"].startswith(str(env.project)))
    assert "blockedReason" not in blocked or both(blocked, "atomic/status modules[]")
    assert both(status["watcher"], "atomic/status watcher") == {"debounceMs", "stepMs"}
    assert both(status["monitor"], "atomic/status monitor") == {"killedForMemory", "reapedIdle", "stoppedOverMaxIdle"}
    assert both(status["service"], "atomic/status service") == {"watchdogSec"}
    assert both(status["bridges"][0], "atomic/status bridges[]") == {"ownerPid"}
    assert status["bridges"][0]["ownerPid"] == daemon.pid


def as_older_daemon(value: Any) -> Any:
    """``value`` as a daemon older than 0.2 sent it: each renamed key under its old name only, where
    the new one was (a result carries both now, with the same value)."""
    if isinstance(value, list):
        return [as_older_daemon(v) for v in value]
    if not isinstance(value, dict):
        return value
    old_of = {new: old for renames in RENAMED.values() for old, new in renames.items()
              if old in value and new in value and value[old] == value[new]}
    return {old_of.get(k, k): as_older_daemon(v) for k, v in value.items() if k not in old_of.values()}


def test_the_cli_prints_an_older_daemons_status_as_a_current_ones(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    # A CLI newer than the daemon that runs (upgraded, not yet restarted) reads the old names.
    import time

    from atomictoolsd.cli.status import render

    env.write_tool(env.global_tools, "greet.py", GREET)
    make_daemon({"ATOMICTOOLS_HTTP": "127.0.0.1:0"})
    with RawConnection(env.socket) as raw:
        raw.request("atomic/attach", {"directory": str(env.project)})
        assert raw.request("tools/call", {"name": "greet", "arguments": {"name": "x"}})["result"]["content"]
        status = raw.request("atomic/status")["result"]
    status["reload"] = {"at": time.time(), "configError": "line 1: bad", "config_error": "line 1: bad"}
    older = as_older_daemon(status)
    assert "failedCalls" not in older["modules"][0] and older["modules"][0]["errors"] == 0
    assert "tokenFile" not in older["http"] and "watchdogSec" not in older["service"]

    def printed(status: dict[str, Any]) -> str:
        return "\n".join(render(status, verbose=True))

    current = printed(status)
    assert printed(older) == current
    assert "NOT reloaded" in current and "line 1: bad" in current and str(status["http"]["tokenFile"]) in current


def test_read_renamed_takes_the_new_name_else_the_old_one_of_that_place() -> None:
    where = "atomic/list tools[] and shadowed[], shadowedBy"
    assert read_renamed({"scope": "local", "source": "local"}, "scope", where) == "local"
    assert read_renamed({"source": "global"}, "scope", where) == "global"  # "source" means the scope here
    assert read_renamed({"source": "cache"}, "definitionsFrom", "atomic/status modules[]") == "cache"
    # http-token --rotate: an older daemon that rotated the token answers with the old name.
    assert read_renamed({"token_file": "/run/t"}, "tokenFile", "atomic/status http, atomic/http/rotate") == "/run/t"
    assert read_renamed({}, "tokenFile", "atomic/status http, atomic/http/rotate") is None


def test_the_version_is_the_one_the_renames_are_told_by() -> None:
    # docs/protocol.md says "renamed in 0.2", old names "until 0.3": a client tells by the version
    # atomic/status and initialize report, so every place that states it says the same 0.2.x.
    import tomllib

    import atomictools
    import atomictoolsd

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    version = pyproject["project"]["version"]
    assert atomictoolsd.__version__ == atomictools.__version__ == version
    assert tuple(int(part) for part in version.split(".")[:2]) == (0, 2), "RENAMED's old names go in 0.3"
