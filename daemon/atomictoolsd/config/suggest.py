"""What to tell a caller who named something that does not exist: a tool, a setting.

Owns the wording and the ``data`` of the unknown-tool error, and the "did you mean" guesses. It
reads a project's view (its tools, load errors, blocked modules) and never changes anything; it
imports nothing of the daemon's, so the session, the CLI and the config can all use it.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from typing import Any

__all__ = ["did_you_mean", "near_names", "unknown_tool"]


def _folded(name: str) -> str:
    # `Greet`, `git_status` and `git-status` are the same guess to a person typing a name.
    return name.lower().replace("-", "_")


def near_names(name: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The candidates closest to ``name`` (a case or ``-``/``_`` slip first), best first."""
    by_fold: dict[str, list[str]] = {}
    for candidate in candidates:
        by_fold.setdefault(_folded(candidate), []).append(candidate)
    folded = _folded(name)
    out = [c for c in by_fold.get(folded, []) if c != name]
    scored = sorted(
        ((difflib.SequenceMatcher(None, folded, fold).ratio(), fold) for fold in by_fold if fold != folded),
        reverse=True,
    )
    # Only the names about as close as the closest: one clear guess is worth more than a list.
    best = scored[0][0] if scored else 0.0
    for score, fold in scored:
        if score < 0.7 or score < best - 0.08:
            break
        out.extend(c for c in by_fold[fold] if c not in out and c != name)
    return out[:n]


def did_you_mean(names: list[str]) -> str:
    """``"; did you mean 'a'?"`` / ``"; did you mean 'a' or 'b'?"``, or ``""``."""
    if not names:
        return ""
    quoted = [repr(n) for n in names]
    listed = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
    return f"; did you mean {listed}?"


def _stem(path: str) -> str:
    base = os.path.basename(path)
    return base.rsplit(".", 1)[0] if "." in base else base


def unknown_tool(
    name: str, visible: Iterable[str], errors: list[dict[str, Any]], blocked: list[dict[str, Any]],
    held: Iterable[dict[str, Any]] = (),
) -> tuple[str, dict[str, Any]]:
    """The message and ``data`` of the JSON-RPC error for a call of a tool that is not served.

    A tool whose module failed to load is named with that load error (file, line, message): the
    name is the module's (``greet`` for ``greet.py``) or one of its ``greet_*`` tools. Otherwise the
    near names the caller may see are suggested.

    Args:
        name: the name the caller asked for.
        visible: the names this caller may call.
        errors: the project's load errors (``{file, line, message, tool?}``).
        blocked: the project's blocked modules (``{file, command, …}``), untrusted.
        held: the project's held modules (``{file, confined, command, …}``: content that came
            through git, unreviewed); one that does not run is named when the name is its module's.
    """
    data: dict[str, Any] = {"name": name}
    for entry in held:
        stem = _stem(str(entry.get("file", "")))
        if not entry.get("confined") and (name == stem or name.startswith(stem + "_")):
            data["held"] = {k: entry.get(k) for k in ("file", "files", "command")}
            why = ("its content arrived through git and was not reviewed" if entry.get("why") == "git"
                   else "where its content came from cannot be told")
            return (f"Tool {name!r} is held until the user reviews its module {entry['file']}: {why}, and this "
                    f"machine cannot confine it; ask the user to run: {entry.get('command')}"), data
    for error in errors:
        skipped = error.get("tool")
        stem = _stem(str(error.get("file", "")))
        if skipped == name or (skipped is None and (name == stem or name.startswith(stem + "_"))):
            where = f"{error['file']}:{error['line']}" if error.get("line") else str(error.get("file"))
            data["loadError"] = {k: error.get(k) for k in ("file", "line", "message")}
            what = "it was skipped" if skipped == name else "its module failed to load"
            return f"Tool {name!r} is not available: {what}: {where}: {error.get('message')}", data
    suggestions = near_names(name, visible)
    data["suggestions"] = suggestions
    message = f"Unknown tool: {name!r}{did_you_mean(suggestions)}"
    if blocked:
        if blocked[0].get("reason"):
            message += f"; this project's own tools are blocked: {blocked[0]['reason']}"
        else:
            advice = blocked[0].get("agentMessage") or blocked[0]["message"]
            message += f"; this project's own tools are blocked until the user trusts the project: {advice}"
    return message, data
