"""Hostile declarative tools: templates that would hand a value to a program as code, values that
would reshape a URL, and servers that pace an exchange to hold a worker.

The shell matrix is generated (wrappers × interpreters × option spellings × where the value sits),
so a spelling the guard was never told about is tried as well as the ones it was; every form must be
refused when the file loads. The forms that are safe load, and take every injection payload as one
argument, against a real daemon. The http matrix runs against a loopback server that records the
path it was sent; the dripping servers against a 1 s timeout.
"""

from __future__ import annotations

import http.server
import itertools
import json
import os
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from atomictoolsd.worker.declarative.loader import load_file
from helpers import Daemon, Env, wait_for
from reliability.test_security import injections

STRING = {"type": "string"}


def shell_tool(name: str, command: str, params: tuple[str, ...] = ("v",)) -> dict[str, Any]:
    return {"name": name, "description": name,
            "inputSchema": {"type": "object", "properties": {p: STRING for p in params}},
            "handler": {"type": "shell", "command": command, "timeout": 20000}}


# -- the matrix of unsafe templates ---------------------------------------------------------------------

# Programs as a template may name them: plain, by path, versioned.
SHELLS = ["sh", "bash", "dash", "zsh", "ksh", "mksh", "/bin/sh", "/usr/bin/bash", "bash5.2", "busybox sh", "rbash"]
SHELL_CODE_OPTIONS = ["-c", "-ec", "-xc", "-ce", "-euxc", "-lc", "-c --", "-e -c", "-c -e", "-o errexit -c",
                      "+e -c", "--norc -c", "-c -o pipefail", "--login -c"]
# Interpreters and the spellings of their options that take code; "{}" is where the code goes.
INTERPRETERS: dict[str, list[str]] = {
    "python": ["-c {}", "-Ic {}", "-uc {}", "-Bc {}", "-W ignore -c {}", "-X dev -c {}", "-I -S -c {}", "-c{}"],
    "perl": ["-e {}", "-E {}", "-ne {}", "-lne {}", "-pe {}", "-lpe {}", "-wle {}", "-Mstrict -e {}", "-e{}",
             "-I /tmp -e {}", "-0777 -ne {}", "-i.bak -pe {}", "-l -0 -e {}", "-ane {}", "-F: -lane {}"],
    "ruby": ["-e {}", "-ne {}", "-pe {}", "-rjson -e {}", "-w -e {}"],
    "node": ["-e {}", "-p {}", "-pe {}", "--eval {}", "--print {}", "--eval={}", "-r fs -e {}", "--require fs --eval {}",
             "--input-type=module -e {}"],
    "php": ["-r {}", "-B {}", "-R {}", "-E {}", "-n -r {}"],
    "lua": ["-e {}", "-W -e {}"],
    "awk": ["{}", "-F: {}", "-v x=1 {}", "--source={}", "-e {}", "-f /dev/null -e {}"],
    "sed": ["{}", "-e {}", "-n -e {}", "-E {}", "--expression={}", "-i -e {}", "-n {}", "-s -e p -e {}"],
    "Rscript": ["-e {}", "--vanilla -e {}"],
    "julia": ["-e {}", "-E {}", "--eval {}"],
    "osascript": ["-e {}"],
    "expect": ["-c {}"],
    "pwsh": ["-c {}", "-Command {}", "-NoProfile -Command {}", "-EncodedCommand {}"],
    "fish": ["-c {}", "--command={}", "-C {}"],
    "deno": ["eval {}"],
    "bun": ["-e {}", "--eval {}", "-p {}"],
    "sqlite3": [":memory: {}", "-cmd {} :memory:"],
    "psql": ["-c {}", "--command={}"],
    "gdb": ["-batch -ex {}", "--eval-command={} /bin/true"],
}
VERSIONED = {"python": ["python3", "python3.11", "/usr/bin/python3.12", "pypy3"], "perl": ["perl5.36", "/usr/bin/perl"],
             "node": ["nodejs", "/usr/local/bin/node"], "awk": ["gawk", "mawk", "nawk", "busybox awk"],
             "sed": ["gsed"], "lua": ["lua5.4", "luajit"], "ruby": ["ruby3.2"], "php": ["php8.2"]}
# Where the value sits inside the code.
CODE_PLACEMENTS = ["{{v}}", "'echo {{v}}'", "'print(\"{{v}}\")'", "'x {{v}} y'", "\"{{v}}\"", "'{{v}}; true'"]
# Wrappers that run the command after them.
WRAPPERS = ["", "env", "env -i", "env LC_ALL=C", "env -u HOME --", "/usr/bin/env", "env -S 'LC_ALL=C'", "sudo",
            "sudo -u root -E", "sudo -- nice", "nice", "nice -n 5", "nice -5", "nohup", "timeout 5", "timeout -s KILL 5",
            "timeout -- 5", "stdbuf -oL", "setsid", "setsid -w", "exec", "command", "time -p", "xargs", "xargs -0",
            "xargs -I{}", "flock /tmp/l", "chrt -o 0", "ionice -c3", "taskset 1", "busybox", "doas", "strace -f",
            "sudo nice -n 5 timeout 10 env A=1", "find . -maxdepth 0 -exec", "find . -execdir"]
# Command lines something hands to a shell, and values that choose the program.
LINES = ["ssh host {{v}}", "ssh -p 22 host echo {{v}}", "ssh host -- 'echo {{v}}'", "watch {{v}}", "watch -n 1 echo {{v}}",
         "eval echo {{v}}", "su -c 'echo {{v}}'", "su root -c {{v}}", "script -qc 'echo {{v}}' /dev/null",
         "flock /tmp/l -c 'echo {{v}}'", "flock -w 1 /tmp/l --command {{v}}", "env -S 'echo {{v}}'",
         "env --split-string='sh -c {{v}}'", "env -S'sh -c' {{v}}", "env -iS 'sh -c' 'echo {{v}}'",
         "env -S 'sh -c \"echo {{v}}\"'", "sudo -s echo {{v}}", "sudo -i {{v}}", "parallel echo {{v}}",
         "sg wheel echo {{v}}", "runuser -c {{v}}", "pwsh -c 'echo' {{v}}", "npx -c 'echo {{v}}'"]
PROGRAMS = ["{{v}}", "{{v}} -x", "/usr/bin/{{v}}", "python{{v}} -c 1", "env {{v}}", "env A=1 {{v}}", "timeout 5 {{v}}",
            "sudo {{v}}", "xargs {{v}}", "find . -exec {{v}} ;", "npx {{v}}", "busybox {{v}}", "nice -n 5 {{v}} x",
            "env {{v}}=1 sh s.sh", "su -s {{v}}", "uvx --from {{v}} black", "python3 {{v}}", "bash {{v}}", "perl {{v}}",
            "node {{v}}", "python3 -m {{v}}", "node -r {{v}} s.js", "perl -M{{v}} s.pl", "ruby -r {{v}} s.rb",
            "lua -l {{v}} s.lua", "php -d {{v}} s.php", "php -f {{v}}", "awk -f {{v}} f", "sed -f {{v}} f",
            "deno run {{v}}", "tclsh {{v}}", "gdb -batch -ex run {{v}}"]
# Where an interpreter or wrapper still reads options, a value could be one (``-e …``).
OPTION_SPOTS = ["perl -e 'print @ARGV' {{v}}", "perl -ne 'print' {{v}}", "node -e 'x' {{v}}", "ruby -e 'p ARGV' {{v}}",
                "php -r 'echo 1;' {{v}}", "sed p {{v}}", "sed -n p f {{v}}", "python3 -X {{v}} s.py",
                "bash -o {{v}} s.sh", "timeout {{v}} true", "ssh {{v}} uptime", "perl -{{v}} s.pl", "node --{{v}} s.js",
                "python3 -W {{v}} s.py", "awk -{{v}} 1 f", "lua -e 'x' {{v}}", "julia -e 'x' {{v}}", "nice {{v}} true",
                "sudo -u root {{v}}"]


def unsafe_templates() -> list[tuple[str, str]]:
    """(family, command) for every generated form that hands a value to a program as code."""
    forms: list[tuple[str, str]] = []
    for shell, option, code in itertools.product(SHELLS, SHELL_CODE_OPTIONS, CODE_PLACEMENTS):
        forms.append(("shell", f"{shell} {option} {code}"))
    for name, spellings in INTERPRETERS.items():
        for program in [name, *VERSIONED.get(name, [])]:
            for spelling, code in itertools.product(spellings, CODE_PLACEMENTS):
                if spelling.endswith("{}") and spelling[-3:-2] not in (" ", "=") and not code.startswith(("'", '"')):
                    code = f"'{code}'"  # an attached spelling (-e{}, -c{}) with the value alone: quote the word
                forms.append(("interpreter", f"{program} {spelling.format(code)}"))
    # Each wrapper in front of a sample of the forms above (every interpreter, several spellings).
    sample = [form for i, form in enumerate(forms) if i % 7 == 0]
    for wrapper in WRAPPERS[1:]:
        for _, form in sample:
            end = " ';'" if wrapper.startswith("find") else ""
            forms.append(("wrapped", f"{wrapper} {form}{end}"))
        for line in LINES + PROGRAMS[1:]:
            forms.append(("wrapped", f"{wrapper} {line}"))
    forms += [("line", line) for line in LINES]
    forms += [("program", program) for program in PROGRAMS]
    forms += [("option", spot) for spot in OPTION_SPOTS]
    return forms


# The safe forms: the value after the code, where the program reads it as an argument. Each prints
# its arguments one a line, bracketed. perl and awk may read an argument as more than data (perl
# -n opens "x|" as a command; awk assigns an operand v=x), so the rule takes free text there only
# when the file says so: their forms carry "unsafeFreeText" (this code never reads them as files).
DECLARED_UNSAFE = ("perl", "awk")
SAFE_INTERPRETERS = {
    "sh": "sh -c 'printf \"[%s]\\n\" \"$@\"' sh {{v}}",
    "bash": "bash -euc 'printf \"[%s]\\n\" \"$@\"' bash {{v}}",
    "perl": "perl -e 'print \"[$_]\\n\" for @ARGV' -- {{v}}",
    "perl-l": "perl -le 'print \"[$_]\" for @ARGV' -- {{v}}",
    # This interpreter by its full, versioned path (a shim on PATH may cost a shell and a pyenv per call).
    "python": f"{os.path.realpath(sys.executable)} -c 'import sys; sys.stdout.write(\"\".join(f\"[{{a}}]\\n\" for a in sys.argv[1:]))' {{{{v}}}}",
    "node": "node -e 'for (const a of process.argv.slice(1)) process.stdout.write(`[${a}]\\n`)' -- {{v}}",
    "awk": "awk 'BEGIN { for (i = 1; i < ARGC; i++) printf \"[%s]\\n\", ARGV[i] }' {{v}}",
}
SAFE_WRAPPERS = ["", "env LC_ALL=C", "env -- ", "env -S 'LC_ALL=C nice'", "timeout 20", "timeout -- 20", "nice -n 5",
                 "stdbuf -oL", "setsid -w", "xargs -0", "nohup"]


def test_every_generated_form_that_runs_a_value_is_refused_at_load(tmp_path: Path, record) -> None:  # type: ignore[no-untyped-def]
    forms = unsafe_templates()
    loaded: list[str] = []
    messages: dict[str, str] = {}
    for start in range(0, len(forms), 400):
        chunk = forms[start:start + 400]
        tools = [shell_tool(f"u{start + i}", command) for i, (_, command) in enumerate(chunk)]
        path = tmp_path / f"matrix{start}.json"
        path.write_text(json.dumps({"tools": tools}))
        specs, problems = load_file(str(path))
        loaded += [forms[int(spec.name[1:])][1] for spec in specs]
        for problem in problems:
            messages[forms[int(problem["tool"][1:])][1]] = problem["message"]
    assert loaded == [], f"{len(loaded)} unsafe templates loaded, e.g. {loaded[:10]}"
    for command, message in messages.items():
        says_what_to_do = ("instead" in message or "Name the" in message or "Put it" in message
                           or "Write the name" in message)
        assert "fixed program name" in message or ("{{v}}" in message and says_what_to_do), (command, message)
    families = {family for family, _ in forms}
    record(f"{len(forms)} generated templates ({len(SHELLS)} shells x {len(SHELL_CODE_OPTIONS)} option spellings, "
           f"{len(INTERPRETERS)} interpreters in {sum(map(len, INTERPRETERS.values()))} spellings under versioned names "
           f"and paths, x {len(CODE_PLACEMENTS)} placements; {len(WRAPPERS) - 1} wrappers in front; command lines, "
           f"programs and option spots; families {sorted(families)}): every one refused at load with the fix")


def test_safe_forms_load_and_take_every_payload_as_one_argument(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    marker = env.root / "injected"
    tools = {}
    for (iname, command), wrapper in itertools.product(SAFE_INTERPRETERS.items(), SAFE_WRAPPERS):
        name = f"{iname}-{len(tools)}"
        tools[name] = (wrapper + " " + command).strip()
    one_or_many = {"type": ["string", "array"], "items": STRING}
    safe = [{**shell_tool(n, c), "inputSchema": {"type": "object", "properties": {"v": one_or_many}}} for n, c in tools.items()]
    for tool in safe:
        if tool["name"].startswith(DECLARED_UNSAFE):
            tool["handler"]["unsafeFreeText"] = ["v"]
    env.write_tool(env.local_tools, "safe.json", json.dumps({"tools": safe}))
    # The unsafe neighbours of each safe form, in the same file's directory: refused, nothing of theirs runs.
    unsafe = {f"bad-{i}": f"{wrapper} {form}".strip() for i, (wrapper, form) in enumerate(zip(
        itertools.cycle(WRAPPERS), [c for _, c in unsafe_templates()[::97]]))}
    env.write_tool(env.local_tools, "unsafe.json", json.dumps({"tools": [shell_tool(n, c) for n, c in unsafe.items()]}))
    daemon: Daemon = make_daemon()
    payloads = injections(marker)
    calls = 0
    with daemon.client() as client:
        listing = client.request("atomic/list")
        listed = {t["name"] for t in listing["tools"]}
        assert listed == set(tools), (set(tools) - listed, listed - set(tools), listing["errors"][:5])
        refused = {e.get("tool") for e in listing["errors"]}
        assert refused == set(unsafe), set(unsafe) - refused
        for index, name in enumerate(tools):
            # Every payload at once, a list: one argument each. Then one at a time: every payload for
            # each form unwrapped, a rotating share for the wrapped ones (node, slow to start: the list only).
            result = client.call_tool(name, {"v": payloads})
            calls += 1
            assert not result.is_error and result.text == "".join(f"[{p}]\n" for p in payloads), (tools[name], result.text)
            if name.startswith("node"):
                continue
            for payload in payloads if tools[name] in SAFE_INTERPRETERS.values() else payloads[index % 17::17]:
                result = client.call_tool(name, {"v": payload})
                calls += 1
                assert not result.is_error and result.text == f"[{payload}]\n", (tools[name], payload, result.text)
    assert not marker.exists(), "a value ran as code"
    record(f"{len(tools)} safe forms ({len(SAFE_INTERPRETERS)} interpreters x {len(SAFE_WRAPPERS)} wrappers) loaded next "
           f"to {len(unsafe)} refused ones; {calls} calls with {len(payloads)} payloads: each value one argument, "
           f"nothing ran")


# -- http: dot segments and URL structure ----------------------------------------------------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.server.seen.append(self.path)  # type: ignore[attr-defined]
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[Any]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


DOT_VALUES = [".", "..", "...", "%2e", "%2E", "%2e%2e", ".%2e", "%2e.", "%2E%2e", "..%2f", "..%2F", "%2e%2e%2f", "..\\",
              "\\..", "..\\..", "a/../b", "../../etc/passwd", "..;", "..;x=1", "..%3b", ".. ", "%252e%252e", "..%252f",
              "./", "/..", "..%5c", "%5c..", "", "a/./b", "..%00", "x/..", "%2e%2e/%2e%2e", "..//", "....//"]
PLAIN_VALUES = ["a.b", ".hidden", "v1.2.3", "...x", "a..b", "x", "%41", "@evil.example:80", "#frag", "?x=1", "//evil.example",
                "a b", "ünï"]


def _dot_part(segment: str) -> bool:
    text = segment
    for _ in range(3):
        for part in text.replace("\\", "/").split("/"):
            core = part.split(";")[0].split("\x00")[0]
            if core and not core.strip(". "):
                return True
        text = urllib.parse.unquote(text)
    return False


def test_no_value_changes_a_urls_structure(env: Env, make_daemon, recorder: Any, record) -> None:  # type: ignore[no-untyped-def]
    base = f"http://127.0.0.1:{recorder.server_port}"
    # name: (URL, its path's segments with None for the value's, the text before the value there)
    templates = {
        "middle": (f"{base}/api/items/{{{{id}}}}/details", ["api", "items", None, "details"], ""),
        "last": (f"{base}/api/{{{{id}}}}", ["api", None], ""),
        "after-dot": (f"{base}/api/.{{{{id}}}}/y", ["api", None, "y"], "."),
        "after-text": (f"{base}/files/v{{{{id}}}}/raw", ["files", None, "raw"], "v"),
        "query": (f"{base}/q/{{{{id}}}}?a={{{{id}}}}&b=1", ["q", None], ""),
    }
    tools = [{"name": name, "description": name, "inputSchema": {"type": "object", "properties": {"id": STRING}},
              "handler": {"type": "http", "url": url, "timeout": 5000}} for name, (url, _, _) in templates.items()]
    env.write_tool(env.local_tools, "web.json", json.dumps({"tools": tools}))
    daemon: Daemon = make_daemon()
    refused = sent = 0
    with daemon.client() as client:
        for (name, (_, shape, prefix)), value in itertools.product(templates.items(), DOT_VALUES + PLAIN_VALUES):
            before = len(recorder.seen)
            result = client.call_tool(name, {"id": value})
            segment = prefix + urllib.parse.quote(value, safe="")
            # Refused exactly when some server would read the segment as empty, '.' or '..'.
            assert result.is_error == (not segment or _dot_part(segment)), (name, value, result.text)
            if result.is_error:
                assert result.text.startswith("Refused: the value of {{id}} would make a URL path segment"), (name, value, result.text)
                assert len(recorder.seen) == before, "a refused call sent nothing"
                refused += 1
                continue
            sent += 1
            assert result.text == "HTTP 200 OK\n\nok", (name, value, result.text)
            seen = recorder.seen[-1]
            path, _, query = seen.partition("?")
            segments = path.split("/")[1:]
            assert len(segments) == len(shape), (name, value, seen)
            for fixed, got in zip(shape, segments, strict=True):
                if fixed is None:
                    assert not _dot_part(got), (name, value, seen)
                else:
                    assert got == fixed, (name, value, seen)
            if name == "query":
                assert urllib.parse.parse_qs(query, keep_blank_values=True) == {"a": [value] if value else [""], "b": ["1"]}, seen
            elif query:
                pytest.fail(f"{name} {value!r}: a query appeared: {seen}")
    assert refused and sent
    record(f"{refused + sent} calls ({len(DOT_VALUES)} dot-segment values: dots, %2e in every case mix, backslashes, ';', "
           f"NUL, double encoding; and {len(PLAIN_VALUES)} plain ones, in {len(templates)} places of a URL): {refused} "
           f"refused before sending, {sent} reached the server with the path's segments, host, port and query unchanged")


# -- http: a server that paces the exchange ----------------------------------------------------------------


class Dripper:
    """A loopback server that answers each connection one byte at a time (``mode`` says which part)."""

    def __init__(self, mode: str, interval: float = 0.1, drip_for: float = 15.0) -> None:
        self.mode, self.interval, self.drip_for = mode, interval, drip_for
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stopping = threading.Event()
        self.dropped: list[float] = []  # how long after accepting the client closed its end
        self.threads: list[threading.Thread] = []
        self.accepter = threading.Thread(target=self._accept, daemon=True)
        self.accepter.start()

    def _accept(self) -> None:
        self.listener.settimeout(0.1)
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        accepted = time.monotonic()
        with conn:
            conn.settimeout(0.05)
            if self.mode != "tls":
                request = b""
                while b"\r\n\r\n" not in request and not self.stopping.is_set():
                    try:
                        request += conn.recv(65536)
                    except TimeoutError:
                        continue
            head = {"status": b"", "headers": b"HTTP/1.1 200 OK\r\n",
                    "body": b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n", "tls": b""}[self.mode]
            drip = {"status": b"HTTP/1.1 200 " + b"K" * 1000, "headers": b"X-Drip: " + b"a" * 1000,
                    "body": b"b" * 100000, "tls": b"\x16\x03\x03\x40\x00" + b"\x00" * 1000}[self.mode]
            try:
                conn.sendall(head)
                for byte in drip:
                    if self.stopping.wait(self.interval) or time.monotonic() - accepted > self.drip_for:
                        return
                    conn.sendall(bytes([byte]))
                    try:
                        if conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                            raise ConnectionResetError  # the client closed its end
                    except (BlockingIOError, TimeoutError):
                        pass  # nothing to read: the client is still there
            except OSError:
                self.dropped.append(time.monotonic() - accepted)

    def stop(self) -> None:
        self.stopping.set()
        self.accepter.join()
        self.listener.close()
        for thread in self.threads:
            thread.join()


def test_a_dripping_server_cannot_hold_a_call_past_its_timeout(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    drippers = {mode: Dripper(mode) for mode in ("status", "headers", "body", "tls")}
    try:
        tools = [{"name": f"drip-{mode}", "description": mode, "inputSchema": {"type": "object", "properties": {}},
                  "handler": {"type": "http", "url": f"{'https' if mode == 'tls' else 'http'}://127.0.0.1:{d.port}/x",
                              "timeout": 1000}} for mode, d in drippers.items()]
        tools.append(shell_tool("worker-pid", "sh -c 'echo $PPID'", ()))  # the worker that serves this file
        env.write_tool(env.local_tools, "drip.json", json.dumps({"tools": tools}))
        daemon: Daemon = make_daemon()
        took: dict[str, float] = {}
        with daemon.client() as client:
            pid = client.call("worker-pid").text.strip()
            for mode, dripper in drippers.items():
                started = time.monotonic()
                result = client.call(f"drip-{mode}")
                took[mode] = time.monotonic() - started
                assert result.is_error and result.text == "HTTP request to 127.0.0.1 timed out after 1 s", (mode, result.text)
                # Answered by the handler, before the daemon's own limit (timeout + 5 s) would kill the worker.
                assert took[mode] < 6, (mode, took[mode])
                assert client.call("worker-pid").text.strip() == pid, f"{mode}: the worker was replaced"
                wait_for(lambda d=dripper: d.dropped, timeout=10, message=f"{mode}: the client closed the connection")
    finally:
        for dripper in drippers.values():
            dripper.stop()
    record(f"4 servers dripping a byte every 0.1 s (the status line, the headers, the body, a TLS handshake) against "
           f"a 1 s timeout: each answered 'timed out after 1 s' in {max(took.values()):.1f} s at most, the connection "
           f"closed, the same worker served the next call")


# -- the positive rule: free text only where a program reads data ----------------------------------------

MAKEFILE = "all:\n\t@echo built\n"
# A name make, perl and the like read as more than data; with the pattern the same tools load.
CONSTRAINED = {"type": "string", "pattern": "^[A-Za-z0-9_./][A-Za-z0-9_./-]*$"}


def _walkarounds(marker: Path) -> dict[str, tuple[str, str, str]]:
    """name: (the command, as docs/declarative.md once advised it, a value that ran a command, a harmless value)."""
    return {
        # An operand NAME=VALUE overrides a variable: .SHELLFLAGS runs the recipe through a command of the value's.
        "make": ("make -- {{v}}", f".SHELLFLAGS=-c touch\\ {marker};:", "all"),
        # -n opens each argument with the two-argument open: "x|" is a command.
        "perl": ("perl -ne 'print' -- {{v}}", f"touch {marker}|", "Makefile"),
    }


def test_values_after_double_dash_that_ran_commands_need_a_constrained_schema(env: Env, make_daemon, record) -> None:  # type: ignore[no-untyped-def]
    marker = env.root / "ran"
    (env.project / "Makefile").write_text(MAKEFILE)
    cases = _walkarounds(marker)
    free = [shell_tool(f"{name}-free", command) for name, (command, _, _) in cases.items()]
    kept = [{**shell_tool(f"{name}-kept", command), "inputSchema": {"type": "object", "properties": {"v": CONSTRAINED}}}
            for name, (command, _, _) in cases.items()]
    # What the file may still say: the payloads are real (each runs its command when let through).
    declared = [{**shell_tool(f"{name}-declared", command), "handler": {
        "type": "shell", "command": command, "unsafeFreeText": ["v"], "okExitCodes": [0, 2]}}
        for name, (command, _, _) in cases.items()]
    env.write_tool(env.local_tools, "walkarounds.json", json.dumps({"tools": free + kept + declared}))
    daemon: Daemon = make_daemon()
    with daemon.client() as client:
        listing = client.request("atomic/list")
        errors = {e.get("tool"): e["message"] for e in listing["errors"]}
        assert {t["name"] for t in listing["tools"]} == {t["name"] for t in kept + declared}, errors
        for name, (_command, payload, harmless) in cases.items():
            message = errors[f"{name}-free"]
            assert "{{v}}" in message and name in message and "Constrain 'v' in inputSchema" in message, message
            assert '"unsafeFreeText": ["v"]' in message, message
            refused = client.call_tool(f"{name}-kept", {"v": payload})
            assert refused.is_error and "must match pattern" in refused.text, refused.text
            served = client.call_tool(f"{name}-kept", {"v": harmless})
            assert not served.is_error, served.text
        assert not marker.exists(), "a value ran a command"
        for name, (_, payload, _) in cases.items():
            client.call_tool(f"{name}-declared", {"v": payload})
            assert marker.exists(), f"the {name} payload is not what runs a command: the test proves nothing"
            marker.unlink()
    record(f"{len(cases)} templates with the value after -- as the docs advised ({', '.join(c for c, _, _ in cases.values())}): "
           f"refused at load naming the parameter, the program and both fixes; with a pattern they load, the payload "
           f"that ran a command is refused by the schema, a plain value served; declared unsafeFreeText, the payload runs")


# Runners the table did not know, where a value is code, a script or the program: refused whatever
# the schema says (a pattern does not make code safe).
RUNNERS = ["ipython -c {{v}}", "ipython3 -c {{v}}", "python3-dbg -c {{v}}", "/usr/bin/python3.12-dbg -c {{v}}",
           "python3.13d -c {{v}}", "dc -e {{v}}", "dc {{v}}", "bc -e {{v}}", "xonsh -c {{v}}", "nu -c {{v}}",
           "nu --commands {{v}}", "uv run {{v}}", "uv run --with {{v}} black", "uv tool run {{v}}", "pipx run {{v}}",
           "pipx install {{v}}", "npm exec {{v}}", "npm exec -c {{v}}", "npm x -- {{v}}", "pnpm dlx {{v}}",
           "yarn dlx {{v}}", "npm install {{v}}", "npm run {{v}}", "prlimit {{v}}", "prlimit --nofile=64 {{v}}",
           "setarch x86_64 {{v}}", "setarch x86_64 -R {{v}}", "linux64 {{v}}", "make -f {{v}}", "make --eval={{v}}",
           "make -C {{v}} all", "git -c {{v}} log", "git -C {{v}} status", "git {{v}}", "git --exec-path={{v}} log",
           "groovy -e {{v}}", "scala -e {{v}}", "elixir -e {{v}}", "erl -eval {{v}}", "guile -c {{v}}",
           "sbcl --eval {{v}}", "java -jar {{v}}", "sort --compress-program={{v}} f", "rg --pre={{v}} x",
           "env -P {{v}} ls", "uvx --python {{v}} black", "timeout 5 ipython -c {{v}}", "env -S 'xonsh -c' {{v}}"]
# Programs the table does not know, and arguments a known one may read as more than data: free
# text is refused, a constrained value loads.
UNKNOWN = ["frobnicate {{v}}", "./tool.sh {{v}}", "/opt/bin/run -- {{v}}", "docker run alpine {{v}}",
           "kubectl exec pod -- {{v}}", "cargo run -- {{v}}", "git checkout -b {{v}}", "git push origin {{v}}",
           "git config user.name {{v}}", "awk '{print}' {{v}}", "perl -e 'print @ARGV' -- {{v}}", "ruby s.rb {{v}}",
           "make {{v}}", "sort -o {{v}} f", "uniq in {{v}}", "jq {{v}} f.json", "find {{v}} -name x",
           "find . -name x {{v}}", "systemd-run --property={{v}} true", "chroot {{v}} ls", "sudo -u {{v}} ls",
           "time -o {{v}} ls", "xargs -a {{v}} echo", "date -s {{v}}", "vim {{v}}", "psql {{v}}", "sqlite3 {{v}} .tables",
           "timeout 5 frobnicate {{v}}", "env A=1 make -- {{v}}"]


def _loading(tmp_path: Path) -> Any:
    """``load(commands, schema)``: the commands of a file of one tool each (``v`` of ``schema``) that
    loaded, and the message of each refused one."""
    def load(commands: list[str], schema: dict[str, Any]) -> tuple[set[str], dict[str, str]]:
        tools = [{**shell_tool(f"c{i}", command), "inputSchema": {"type": "object", "properties": {"v": schema}}}
                 for i, command in enumerate(commands)]
        path = tmp_path / "rule.json"
        path.write_text(json.dumps({"tools": tools}))
        specs, problems = load_file(str(path))
        loaded = {commands[int(spec.name[1:])] for spec in specs}
        return loaded, {commands[int(p["tool"][1:])]: p["message"] for p in problems}

    return load


def test_a_positive_rule_refuses_what_no_table_listed(tmp_path: Path, record) -> None:  # type: ignore[no-untyped-def]
    load = _loading(tmp_path)
    loaded, _ = load(RUNNERS, CONSTRAINED)
    assert loaded == set(), f"run by a value whatever its schema: {sorted(loaded)}"
    loaded, messages = load(UNKNOWN, STRING)
    assert loaded == set(), f"free text where a program may read more than data: {sorted(loaded)}"
    for command, message in messages.items():
        assert "{{v}}" in message and "Constrain 'v' in inputSchema instead" in message, (command, message)
    loaded, messages = load(UNKNOWN, CONSTRAINED)
    assert loaded == set(UNKNOWN), messages
    unsafe_key = [{**shell_tool(f"c{i}", command), "handler": {"type": "shell", "command": command, "unsafeFreeText": ["v"]}}
                  for i, command in enumerate(UNKNOWN)]
    (tmp_path / "declared.json").write_text(json.dumps({"tools": unsafe_key}))
    specs, problems = load_file(str(tmp_path / "declared.json"))
    assert len(specs) == len(UNKNOWN), problems
    record(f"{len(RUNNERS)} templates where a value is code, a script or the program for runners the old table missed "
           f"(ipython, python3-dbg, dc, xonsh, nu, uv run, pipx run, npm exec, prlimit, setarch, …): refused even with a "
           f"pattern; {len(UNKNOWN)} templates handing free text to unknown programs or to arguments read as more "
           f"than data: refused with the fix, loaded with a constrained schema or unsafeFreeText")


# A value an env wrapper puts in a variable is data to env, and to most programs; not to the dynamic
# loader, a shell or a runtime that reads that variable as code or as what to run: a path the agent
# wrote (a library, a script) is all a value needs there, so no pattern makes it safe.
RUN_BY_VARIABLE = ["env LD_PRELOAD={{v}} cat f", "env BASH_ENV={{v}} bash -c 'echo hi'", "env ENV={{v}} sh -i",
                   "env GIT_EXTERNAL_DIFF={{v}} git diff --ext-diff", "env GIT_PAGER={{v}} git -p log",
                   "env PAGER={{v}} man ls", "env GIT_SSH_COMMAND={{v}} git fetch", "env NODE_OPTIONS={{v}} node s.js",
                   "env PERL5OPT={{v}} perl s.pl", "env PYTHONSTARTUP={{v}} python3 -i", "env RUBYOPT={{v}} ruby s.rb",
                   "env PYTHONPATH={{v}} python3 s.py", "env JAVA_TOOL_OPTIONS={{v}} java -jar a.jar",
                   "env EDITOR={{v}} crontab -e", "env HOME={{v}} git log", "env GIT_DIR={{v}} git status",
                   "env KUBECONFIG={{v}} kubectl get pods", "nice env LD_PRELOAD={{v}} cat f",
                   "env -i LD_LIBRARY_PATH={{v}} ./tool", "timeout 5 env PROMPT_COMMAND={{v}} bash -i",
                   # Build tools' programs and options, configs that load code, npm's settings in the case npm writes:
                   "env CC={{v}} make", "env CFLAGS={{v}} make", "env RUSTFLAGS={{v}} cargo build",
                   "env RUSTC_WRAPPER={{v}} cargo build", "env OPENSSL_CONF={{v}} openssl version",
                   "env npm_config_script_shell={{v}} npm run build", "env PIP_INDEX_URL={{v}} pip install x",
                   "env LESS={{v}} less f"]
DATA_BY_VARIABLE = ["env P={{v}} sh -c 'printf \"[%s]\\n\" \"$P\"'", "env QUERY={{v}} ./search.sh",
                    "env GIT_AUTHOR_NAME={{v}} git log -1", "env LC_ALL=C TZ={{v}} date"]


def test_a_value_in_a_variable_something_runs_is_refused_whatever_its_schema(tmp_path: Path, record) -> None:  # type: ignore[no-untyped-def]
    load = _loading(tmp_path)
    loaded, messages = load(RUN_BY_VARIABLE, CONSTRAINED)
    assert loaded == set(), f"a value in a variable that is run or loaded: {sorted(loaded)}"
    for command, message in messages.items():
        assert "{{v}}" in message and "a name of your own" in message, (command, message)
    loaded, messages = load(DATA_BY_VARIABLE, STRING)
    assert loaded == set(DATA_BY_VARIABLE), messages
    record(f"{len(RUN_BY_VARIABLE)} templates putting a value in a variable the loader, a shell or a runtime runs or "
           f"loads (LD_PRELOAD, BASH_ENV, GIT_PAGER, NODE_OPTIONS, HOME, …), behind wrappers too: refused even with a "
           f"pattern, naming the fix; a value in a variable of the template's own name still free text")
