"""A tools dir crowded by its repository: tens of thousands of files named like modules.

What holds: the daemon looks at no more than ``MAX_MODULES`` of them (the first by name) and reports
the rest once, so attaching to such a project, and listing it, keep every other client served.
"""

from __future__ import annotations

import os
import time

from atomictoolsd.config.discovery import MAX_MODULES
from helpers import Env, RawConnection, pinging

CROWD = 20_000


def _crowd(tools_dir: os.PathLike[str]) -> None:
    os.makedirs(tools_dir)
    fd = os.open(tools_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(CROWD):
            os.close(os.open(f"m{i:05}.py", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
    finally:
        os.close(fd)


def test_twenty_thousand_module_files_of_an_untrusted_project_stall_nothing(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    env.set_trust_all(False)
    _crowd(env.local_tools)
    daemon = make_daemon()
    with pinging(env.socket) as pings, RawConnection(env.socket, timeout=60) as raw:
        started = time.monotonic()
        attach = raw.request("atomic/attach", {"directory": str(env.project)})
        attached = time.monotonic() - started
        listed = raw.request("atomic/list", {})["result"]
    assert "result" in attach, attach
    waited = sum(max(0.0, took - 0.1) for took in pings)
    assert waited < 0.5, f"pings waited {waited:.2f} s in all (the slowest {max(pings):.2f} s) while the project attached"
    blocked = {os.path.basename(entry["file"]) for entry in listed["blocked"]}
    assert blocked == {f"m{i:05}.py" for i in range(MAX_MODULES)}
    (crowded,) = [e for e in listed["errors"] if e["file"] == str(env.local_tools)]
    assert f"holds {CROWD} entries named like tool modules" in crowded["message"]
    # The blocked modules are logged in one line, not a line each.
    said = [line for line in daemon.stderr().splitlines() if "not loading" in line]
    assert len(said) == 1 and f"not loading {MAX_MODULES} modules of {env.local_tools}" in said[0], said[:3]
    record(f"{CROWD} module files: {MAX_MODULES} listed as blocked, attach in {attached:.2f} s, "
           f"{len(pings)} pings answered within {max(pings) * 1000:.0f} ms")
