"""Where the socket and the daemon's files are, and the checks on them (paths, atomictools._paths)."""

from __future__ import annotations

import os
import pwd
import re
from pathlib import Path

import platformdirs
import pytest

from atomictools._paths import (
    PROJECT_MARKERS,
    LocationError,
    RuntimeDirError,
    check_location,
    check_locations,
    project_area,
    project_free_path,
    runtime_dir,
    socket_path,
)
from atomictoolsd.config.paths import PathError, Paths, check_private_dir, check_socket_path
from atomictoolsd.worker.sandbox import PROTECTED


def test_runtime_dir_agrees_with_platformdirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    xdg = tmp_path / "run"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    monkeypatch.delenv("ATOMICTOOLS_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("ATOMICTOOLS_SOCKET", raising=False)
    assert runtime_dir() == platformdirs.user_runtime_dir("atomictools") == str(xdg / "atomictools")
    assert socket_path() == str(xdg / "atomictools" / "atomictoolsd.sock")


@pytest.mark.parametrize("problem", ["mode", "relative", "symlink", "file"])
def test_an_unusable_xdg_runtime_dir_is_refused_never_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, problem: str
) -> None:
    xdg = tmp_path / "run"
    if problem == "mode":
        xdg.mkdir()
        os.chmod(xdg, 0o755)  # open to others: docs/configuration.md promises a refusal
        value, expected = str(xdg), f"has mode 0755.*chmod 700 {xdg}"
    elif problem == "relative":
        value, expected = "run", "is not an absolute path"
    elif problem == "symlink":
        (tmp_path / "real").mkdir(mode=0o700)
        xdg.symlink_to(tmp_path / "real")
        value, expected = str(xdg), "is a symlink"
    else:
        xdg.write_text("")
        value, expected = str(xdg), "is not a directory"
    monkeypatch.setenv("XDG_RUNTIME_DIR", value)
    monkeypatch.delenv("ATOMICTOOLS_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("ATOMICTOOLS_SOCKET", raising=False)
    with pytest.raises(RuntimeDirError, match=expected):
        runtime_dir()
    with pytest.raises(RuntimeDirError, match="ATOMICTOOLS_RUNTIME_DIR"):
        socket_path()
    monkeypatch.setenv("ATOMICTOOLS_RUNTIME_DIR", str(tmp_path / "mine"))  # the way out it names
    assert runtime_dir() == str(tmp_path / "mine")


def test_a_missing_xdg_runtime_dir_is_used_as_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "later"))  # the daemon creates it, 0700
    monkeypatch.delenv("ATOMICTOOLS_RUNTIME_DIR", raising=False)
    assert runtime_dir() == str(tmp_path / "later" / "atomictools")


def test_environment_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATOMICTOOLS_RUNTIME_DIR", str(tmp_path / "r"))
    assert socket_path() == str(tmp_path / "r" / "atomictoolsd.sock")
    monkeypatch.setenv("ATOMICTOOLS_SOCKET", str(tmp_path / "s.sock"))
    assert socket_path() == str(tmp_path / "s.sock")


def test_isolating_home_and_xdg_moves_every_path(env: object) -> None:
    paths = Paths.from_env()
    root = env.root  # type: ignore[attr-defined]
    for path in (paths.state_dir, paths.config_dir, paths.cache_dir, paths.log_dir, paths.spill_dir):
        assert str(path).startswith(str(root)), path
    assert paths.socket == env.socket  # type: ignore[attr-defined]
    assert paths.home == env.home  # type: ignore[attr-defined]


def test_private_dir_is_created_0700_and_checked(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    check_private_dir(target)
    assert oct(os.stat(target).st_mode & 0o777) == "0o700"
    os.chmod(target, 0o750)
    with pytest.raises(PathError, match="chmod 700"):
        check_private_dir(target)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(PathError, match="symlink"):
        check_private_dir(link)


def test_socket_paths_longer_than_sun_path_are_refused(tmp_path: Path) -> None:
    check_socket_path(Path("/tmp/short.sock"))
    with pytest.raises(PathError, match="ATOMICTOOLS_SOCKET"):
        check_socket_path(Path("/tmp/" + "x" * 120 + ".sock"))


def test_every_private_dir_the_daemon_makes_is_0700_with_its_parents(tmp_path: Path) -> None:
    # Under a umask of 000, mkdir(parents=True, mode=0o700) leaves the parents it makes 0777: another
    # user could swap them. The trust store and the event log each make theirs (make_private_dirs).
    import os
    import stat

    from atomictoolsd.eventlog.writer import EventLog
    from atomictoolsd.registry.trust import TrustStore

    old = os.umask(0)
    try:
        TrustStore(tmp_path / "state" / "deep").trust(tmp_path)
        log = EventLog()
        log.open(tmp_path / "logs" / "deep" / "atomictoolsd.log")
        log.close()
    finally:
        os.umask(old)
    for made in ("state", "state/deep", "logs", "logs/deep"):
        assert stat.S_IMODE(os.stat(tmp_path / made).st_mode) == 0o700, made


def _repository(tmp_path: Path) -> Path:
    """A clone with a submodule: the outer repository's files are a repository's too."""
    outer = tmp_path / "outer"
    (outer / ".git").mkdir(parents=True)
    inner = outer / "vendor" / "lib"
    inner.mkdir(parents=True)
    (inner / ".git").write_text("gitdir: ../../.git/modules/lib\n")
    return inner


def test_the_project_area_is_the_outermost_repository_below_the_home(tmp_path: Path) -> None:
    inner = _repository(tmp_path)
    assert project_area(str(inner / "src")) == str((tmp_path / "outer").resolve())
    plain = tmp_path / "downloads" / "untarred"
    plain.mkdir(parents=True)
    assert project_area(str(plain)) is None, "no repository, no agent config: no project"
    (plain / ".mcp.json").write_text("{}")  # an agent's project config: the door an entry comes in by
    assert project_area(str(plain)) == str(plain.resolve())
    home = os.path.realpath(pwd.getpwuid(os.geteuid()).pw_dir)  # the account's: no variable moves it
    assert project_area(home) is None and project_area("/") is None, "your home is no project"


def test_every_door_a_repository_gives_an_agent_an_entry_by_is_protected_from_confined_tools() -> None:
    """What makes a directory a project (its agents' project configs) is what confined tools may not
    write: each names commands an agent or editor runs, unconfined, when it opens the project."""
    assert {m.casefold() for m in PROJECT_MARKERS} <= {p.casefold() for p in PROTECTED}


def test_a_path_keeps_no_directory_of_the_starters_project(tmp_path: Path) -> None:
    """The PATH a daemon is started with: the entries in the project of the anchor (as written or
    through a link) are left out, in their order; the rest, relative ones included, kept as they are."""
    inner = _repository(tmp_path)
    area = tmp_path / "outer"
    (tmp_path / "tools-link").symlink_to(area / "bin")
    outside = tmp_path / "elsewhere" / "bin"
    entries = [str(area / "bin"), "/usr/bin", str(tmp_path / "tools-link"), "", "rel/bin", str(outside), f"{area}/../outer/x"]
    kept, left_out = project_free_path(os.pathsep.join(entries), anchors=[str(inner)])
    assert kept.split(os.pathsep) == ["/usr/bin", "", "rel/bin", str(outside)]
    assert left_out == [str(area / "bin"), str(tmp_path / "tools-link"), f"{area}/../outer/x"]
    assert project_free_path(os.pathsep.join(entries), anchors=[str(outside)]) == (os.pathsep.join(entries), [])


@pytest.mark.parametrize(
    ("value", "problem"),
    [  # relative, inside a repository, through a link, open to others, to be made where others write
        ("cfg", "is a relative path"),
        ("{area}/.atomictools", "is inside the project {area}"),
        ("{outside}/link", "is inside the project {area}"),  # a link out of the project into it
        ("{open}", "can be written by other users (mode 0777)"),
        ("{open}/new", "does not exist yet, and {open}, where it would be made, can be written by other users"),
    ],
)
def test_a_variable_that_places_the_daemons_files_is_checked(tmp_path: Path, value: str, problem: str) -> None:
    area = str((tmp_path / "outer").resolve())
    inner = _repository(tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "link").symlink_to(inner)
    opened = tmp_path / "open"
    opened.mkdir()
    opened.chmod(0o777)
    value = value.format(area=area, outside=outside, open=opened)
    with pytest.raises(LocationError, match=re.escape(problem.format(area=area, open=opened))) as refused:
        check_location("XDG_CONFIG_HOME", value, [area])
    assert str(refused.value).startswith(f"XDG_CONFIG_HOME={value} ")
    assert check_location("XDG_CONFIG_HOME", str(outside), [area]) == str(outside)


def test_every_process_refuses_a_home_in_the_project_of_its_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inner = _repository(tmp_path)
    monkeypatch.chdir(inner)
    monkeypatch.setenv("HOME", str(tmp_path / "outer" / "home"))
    with pytest.raises(PathError, match="HOME=.* is inside the project"):
        Paths.from_env()
    with pytest.raises(LocationError, match="HOME="):
        check_locations()
    check_locations(anchors=[str(tmp_path)])  # from elsewhere, that home is no repository's
