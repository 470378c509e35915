"""A load report names at most what the daemon accepts: the daemon refuses a longer one from the
lengths msgpack announces (``protocol.FileReport``, ``SiteReport``), so each runtime bounds its own
report to the same numbers; a module that imports more still loads."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import msgspec
import pytest

from atomictoolsd import protocol
from atomictoolsd.protocol import MAX_LOAD_REPORT, MAX_REPORTED_FILES, MAX_SITE_DIRS, Failed, FrameReader, encode_frame
from atomictoolsd.worker import environment

WORKER_JS = Path(protocol.__file__).parent / "worker" / "js" / "worker.mjs"


def test_the_javascript_runtime_reports_no_more_than_the_daemon_accepts() -> None:
    source = WORKER_JS.read_text()
    files = re.search(r"^const MAX_REPORTED_FILES = (\d+)$", source, re.MULTILINE)
    assert files is not None, "worker.mjs bounds the files its load report names"
    assert int(files.group(1)) == MAX_REPORTED_FILES
    size = re.search(r"^const MAX_LOAD_REPORT = (\d+) << (\d+)$", source, re.MULTILINE)
    assert size is not None, "worker.mjs bounds the size of its load report"
    assert int(size.group(1)) << int(size.group(2)) == MAX_LOAD_REPORT
    dropped = re.search(r"^const MAX_DROPPED_KEYS = (\d+) ", source, re.MULTILINE)
    assert dropped is not None, "worker.mjs bounds the undeclared arguments it reports"
    assert int(dropped.group(1)) == protocol.MAX_DROPPED_KEYS


def test_a_failed_load_on_a_path_of_many_site_dirs_reports_what_the_daemon_accepts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dirs = []
    for i in range(MAX_SITE_DIRS + 5):
        site = tmp_path / f"env{i}" / "site-packages"
        site.mkdir(parents=True)
        dirs.append(str(site))
    monkeypatch.setattr(sys, "path", [*sys.path, *dirs])
    report = environment.site_report(failed=True)
    assert len(report) == MAX_SITE_DIRS
    frame = encode_frame(Failed({"file": "/t.py", "line": None, "message": "m", "traceback": "", "site": report}))  # type: ignore[arg-type]
    decoded = FrameReader(type=protocol.WorkerMessage).feed(frame)
    assert [d for d, _, _ in decoded[0].info.site] == [d for d, _, _ in report]


def test_a_report_naming_more_is_refused_before_it_is_built() -> None:
    too_many = [["/t/x.py", 1, 0]] * (MAX_REPORTED_FILES + 1)
    frame = encode_frame(Failed({"file": "/t.py", "line": None, "message": "m", "traceback": "", "helpers": too_many}))  # type: ignore[arg-type]
    with pytest.raises(protocol.FrameError, match=r"length <= 4096"):
        FrameReader(type=protocol.WorkerMessage).feed(frame)
    # A key the daemon does not read is skipped, however large.
    frame = encode_frame(Failed({"file": "/t.py", "message": "m", "junk": too_many * 50}))  # type: ignore[arg-type]
    [message] = FrameReader(type=protocol.WorkerMessage).feed(frame)
    assert msgspec.to_builtins(message.info)["message"] == "m"
