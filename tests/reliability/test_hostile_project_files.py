"""A repository's own files the daemon reads beside its tools dir: its ``.venv/pyvenv.cfg``.

What holds: ``atomic/list`` describes the environment a project has by reading its ``pyvenv.cfg``,
and a FIFO there, or a file of tens of megabytes, holds up no client: such a file is not an
environment, and the listing answers at once.
"""

from __future__ import annotations

import os
import time

from helpers import Env, RawConnection, pinging


def test_a_fifo_or_a_huge_pyvenv_cfg_holds_up_no_listing(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    (env.project / ".venv").mkdir()
    os.mkfifo(env.project / ".venv" / "pyvenv.cfg")  # never written: reading it waits forever
    (env.project / "venv").mkdir()
    with open(env.project / "venv" / "pyvenv.cfg", "w") as cfg:
        cfg.write("version = 3.0.0\n" + "key = value\n" * 2_500_000)  # 30 MB of lines
    make_daemon()
    with pinging(env.socket) as pings, RawConnection(env.socket, timeout=10) as raw:
        raw.request("atomic/attach", {"directory": str(env.project)})
        started = time.monotonic()
        listed = raw.request("atomic/list", {})
        took = time.monotonic() - started
    assert took < 2.0, f"the listing took {took:.1f} s"
    waited = sum(max(0.0, t - 0.1) for t in pings)
    assert waited < 0.5, f"pings waited {waited:.2f} s in all (the slowest {max(pings):.2f} s) while the project was listed"
    assert "result" in listed and "environment" not in listed["result"], listed
    record(f"a FIFO and a 30 MB pyvenv.cfg: listed in {took * 1000:.0f} ms, "
           f"{len(pings)} pings answered within {max(pings) * 1000:.0f} ms")
