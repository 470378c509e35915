"""``atomictoolsd status``: a setting's source true to where its value in force came from."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

from helpers import Env, wait_for


def cli(env: Env, *args: str, columns: int | None = None, cwd: Any = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in env.vars.items() if k != "COLUMNS"}
    if columns is not None:
        environ["COLUMNS"] = str(columns)
    return subprocess.run([sys.executable, "-m", "atomictoolsd", *args], env=environ, cwd=cwd or env.root,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


def test_a_setting_waiting_for_a_restart_keeps_the_source_of_the_value_in_force(env: Env, make_daemon: Any) -> None:
    """The file asks for http and builtins after the daemon started: they wait for a restart, and
    the values in force (the defaults) are not said to come from the file."""
    env.vars.pop("ATOMICTOOLS_BUILTINS")
    config = env.write_config()
    daemon = make_daemon()
    config.write_text(config.read_text() + 'builtins = false\nhttp = "127.0.0.1:0"\ncall_timeout = 7\n')
    daemon.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: json.loads(cli(env, "status", "--json").stdout).get("reload"), message="the reload")
    status = json.loads(cli(env, "status", "--json").stdout)
    assert status["reload"]["waiting"] == {"builtins": False, "http": "127.0.0.1:0"}
    assert (status["config"]["builtins"], status["config"]["http"]) == (True, "")
    assert "builtins" not in status["configSources"] and "http" not in status["configSources"], status["configSources"]
    assert status["configSources"]["call_timeout"] == str(config)  # what did apply is the file's
    shown = cli(env, "status").stdout
    lines = shown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("SETTING "))
    settings = [line.split()[0] for line in lines[start + 1:] if line[:1].isalpha()]
    assert "builtins" not in settings and "http" not in settings and "call_timeout" in settings, shown
    assert "builtins = false waits for a restart (in force: true" in shown
