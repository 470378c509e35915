"""The trust store on its own: where it lives, who may write it, and concurrent changes (trust)."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from atomictoolsd.registry.trust import TrustError, TrustStore, trust_command


def project(tmp_path: Path, name: str) -> str:
    """A real directory: trust is of a directory, not of a path."""
    path = tmp_path / "p" / name
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def test_trust_and_untrust_round_trip_in_a_private_file(tmp_path: Path) -> None:
    store = TrustStore(tmp_path / "state")
    one = project(tmp_path, "one")
    assert not store.is_trusted(one)
    assert store.trust(one) is True
    assert store.trust(one) is False
    assert store.is_trusted(one) and not store.is_trusted(str(tmp_path / "p"))
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    assert list(store.entries()) == [one] and "trusted_at" in store.entries()[one]
    assert store.untrust(one) is True and store.untrust(one) is False
    assert not store.is_trusted(one)


def test_another_writer_is_seen_at_once(tmp_path: Path) -> None:
    reader, writer = TrustStore(tmp_path), TrustStore(tmp_path)
    p = project(tmp_path, "p")
    assert not reader.is_trusted(p)
    writer.trust(p)
    assert reader.is_trusted(p)
    writer.untrust(p)
    assert not reader.is_trusted(p)


def test_concurrent_changes_are_not_lost(tmp_path: Path) -> None:
    roots = [project(tmp_path, str(i)) for i in range(24)]
    threads = [threading.Thread(target=TrustStore(tmp_path).trust, args=(root,)) for root in roots]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(TrustStore(tmp_path).entries()) == sorted(roots)


@pytest.mark.parametrize(
    ("content", "mode", "problem"),
    [
        ('{"version": 1, "projects": {"/p": {}}}', 0o620, "can be written by other users"),
        ("{not json", 0o600, "is not a valid trust store"),
        ('{"version": 1, "projects": ["/p"]}', 0o600, "is not a valid trust store"),
    ],
)
def test_a_suspect_store_trusts_nothing_and_is_not_overwritten(tmp_path: Path, content: str, mode: int, problem: str) -> None:
    store = TrustStore(tmp_path)
    store.path.write_text(content)
    os.chmod(store.path, mode)
    assert not store.is_trusted("/p")
    assert problem in (store.problem or "")
    with pytest.raises(TrustError, match=problem):
        store.trust(project(tmp_path, "q"))
    assert store.path.read_text() == content


def test_the_trust_command_is_quoted_for_a_shell() -> None:
    from atomictoolsd.config.command import command_name

    # The command itself is spelled as it runs here (the full path when PATH does not find it).
    assert trust_command("/home/me/my project") == f"{command_name()} trust '/home/me/my project'"
    assert trust_command(Path("/srv/app")) == f"{command_name()} trust /srv/app"


@pytest.mark.parametrize("path", ["/srv/a\x1b[2Jb", "/srv/it's\nthere", "/srv/\u202eppa", "/srv/b\udcffd", "/srv/back\\slash\t"])
def test_a_path_a_terminal_would_act_on_is_quoted_so_the_command_still_names_it(path: str) -> None:
    """$'…' quoting: printed, it holds no control character; pasted into bash, it is the same path."""
    import subprocess

    quoted = trust_command(path).split(" trust ", 1)[1]
    assert quoted.startswith("$'") and quoted.isprintable(), quoted
    echoed = subprocess.run(["bash", "-c", f"printf %s {quoted}"], capture_output=True, check=True).stdout
    assert echoed == os.fsencode(path)


def test_the_file_format(tmp_path: Path) -> None:
    store = TrustStore(tmp_path / "state")
    b, a = project(tmp_path, "b"), project(tmp_path, "a")
    store.trust(b)
    store.trust(a)
    data = json.loads(store.path.read_text())
    assert data["version"] == 2 and list(data["projects"]) == [a, b]
    assert {"trusted_at", "dev", "ino"} <= set(data["projects"][a])


def test_a_replaced_directory_is_another_one(tmp_path: Path) -> None:
    store = TrustStore(tmp_path / "state")
    p = project(tmp_path, "p")
    store.trust(p)
    os.rmdir(p)
    assert store.state(p) == "missing" and not store.is_trusted(p)
    os.mkdir(p)  # ext4 often hands out the inode number just freed: the birth time still differs
    assert store.state(p) == "replaced" and not store.is_trusted(p)
    assert store.trust(p) is True and store.is_trusted(p)


def test_a_directory_is_needed_to_trust(tmp_path: Path) -> None:
    with pytest.raises(TrustError, match="not a directory"):
        TrustStore(tmp_path).trust(str(tmp_path / "nothing"))


def test_levels_a_store_without_them_reads_as_full(tmp_path: Path) -> None:
    store = TrustStore(tmp_path / "state")
    old, new = project(tmp_path, "old"), project(tmp_path, "new")
    store.path.parent.mkdir(mode=0o700)
    store.path.write_text(json.dumps({"version": 1, "projects": {old: {"trusted_at": "2026-01-01T00:00:00+0000"}}}))
    os.chmod(store.path, 0o600)
    assert store.level(old) == "full" and store.level(new) is None
    assert store.trust(new, "sandbox", {"net": True}) is True
    assert store.level(new) == "sandbox" and store.entry(new)["allow"] == {"net": True}  # type: ignore[index]
    assert store.trust(new, "sandbox", {"net": True}) is False
    assert store.trust(new, "sandbox") is True, "a narrower allowance is a change"
    assert "allow" not in store.entry(new)  # type: ignore[operator]
    assert store.trust(old, "sandbox") is True and store.level(old) == "sandbox"
    assert store.trust(old) is True and store.level(old) == "full"
    assert store.untrust(new) is True and store.level(new) is None
    with pytest.raises(TrustError, match="unknown trust level"):
        store.trust(old, "partial")
    assert trust_command("/p q", sandbox=True).endswith("trust --sandbox '/p q'")
