"""Truncation of large tool output, and the spill files that keep the whole (workers.truncate)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from atomictoolsd.worker.removal import remove_tree
from atomictoolsd.worker.truncate import remove_old_spills, truncate


def test_output_within_limits_is_untouched(tmp_path: Path) -> None:
    assert truncate("a\n" * 1999, 2000, 50 * 1024, str(tmp_path)) is None
    assert truncate("x" * 50 * 1024, 2000, 50 * 1024, str(tmp_path)) is None
    assert list(tmp_path.iterdir()) == []


def test_too_many_lines_keeps_the_head_and_spills_the_whole(tmp_path: Path) -> None:
    text = "".join(f"line {i}\n" for i in range(5000))
    cut = truncate(text, 2000, 50 * 1024, str(tmp_path / "spill"), "lint")
    assert cut is not None
    head, notice = cut.text.rsplit("\n[", 1)
    assert head.splitlines() == [f"line {i}" for i in range(2000)]
    assert "showing 2,000 of 5,000 lines" in notice and cut.path in notice
    assert Path(cut.path).read_text() == text
    assert Path(cut.path).name.startswith("lint-")
    assert oct(os.stat(tmp_path / "spill").st_mode & 0o777) == "0o700"


def test_too_many_bytes_cuts_at_a_line_and_never_splits_a_character(tmp_path: Path) -> None:
    text = ("é" * 99 + "\n") * 2000  # 200 bytes a line, 400 KB
    cut = truncate(text, 100000, 50 * 1024, str(tmp_path))
    assert cut is not None
    head = cut.text.split("\n[output truncated")[0]
    assert len(head.encode()) <= 50 * 1024
    assert all(line == "é" * 99 for line in head.splitlines())
    assert Path(cut.path).read_text() == text


def test_one_huge_line_is_cut_by_bytes(tmp_path: Path) -> None:
    cut = truncate("z" * 200_000, 2000, 1000, str(tmp_path))
    assert cut is not None
    assert cut.text.startswith("z" * 1000 + "\n[output truncated")


def test_old_spill_files_are_removed(tmp_path: Path) -> None:
    old, new = tmp_path / "old.txt", tmp_path / "new.txt"
    old.write_text("o")
    new.write_text("n")
    past = time.time() - 7200
    os.utime(old, (past, past))
    assert remove_old_spills(str(tmp_path), 3600) == 1
    assert not old.exists() and new.exists()
    assert remove_old_spills(str(tmp_path / "missing"), 3600) == 0


def test_a_workers_tree_is_removed_without_following_or_blocking(tmp_path: Path) -> None:
    # What a worker may leave in its TMPDIR: FIFOs (an open for reading would wait for a writer), links
    # to a directory of the user's, directories deep and wide. All of it goes; the user's files stay.
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("the user's")
    tree = tmp_path / "tmpdir"
    deep = tree.joinpath(*(f"d{i}" for i in range(20)))
    deep.mkdir(parents=True)
    for where in (tree, deep):
        os.mkfifo(where / "fifo")
        os.symlink(victim, where / "link")
        os.symlink(victim / "keep", where / "file-link")
        (where / "file").write_text("x")
    remove_tree(str(tree))
    assert not tree.exists()
    assert (victim / "keep").read_text() == "the user's"
    remove_tree(str(tree))  # gone already: nothing to do, nothing raised
