"""Project notes, to show how tools in one file are named.

The function named like the file is the tool of that name (`notes`); every other tool is
`<file>_<function>`: `notes_add` and `notes_remove`. Notes live in `.atomic/notes.jsonl` at the
project root, one JSON object per line.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Annotated

import msgspec

from atomictools import Context, Field, ToolError, tool


class Note(msgspec.Struct):
    id: int
    text: str
    tags: list[str]
    created: str


def _store(ctx: Context) -> Path:
    return Path(ctx.worktree or ctx.directory or os.getcwd()) / ".atomic" / "notes.jsonl"


def _read(ctx: Context) -> list[Note]:
    try:
        lines = _store(ctx).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    return [msgspec.json.decode(line, type=Note) for line in lines if line.strip()]


@tool(annotations={"readOnlyHint": True})
def notes(
    ctx: Context,
    search: Annotated[str, Field("Only notes containing this text (case-insensitive)", max_length=200)] | None = None,
    tag: Annotated[str, Field("Only notes with this tag", pattern=r"^[a-z0-9-]{1,32}$")] | None = None,
) -> list[Note]:
    """List the project's notes, newest last, optionally filtered by text or tag."""
    found = _read(ctx)
    if search:
        found = [n for n in found if search.lower() in n.text.lower()]
    if tag:
        found = [n for n in found if tag in n.tags]
    return found


@tool
def add(
    ctx: Context,
    text: Annotated[str, Field("The note", min_length=1, max_length=2000)],
    tags: Annotated[list[Annotated[str, Field(pattern=r"^[a-z0-9-]{1,32}$")]], Field(max_length=8)] = [],  # noqa: B006
) -> Note:
    """Add a note to the project."""
    existing = _read(ctx)
    note = Note(id=max((n.id for n in existing), default=0) + 1, text=text, tags=tags,
                created=time.strftime("%Y-%m-%dT%H:%M:%S"))
    store = _store(ctx)
    store.parent.mkdir(parents=True, exist_ok=True)
    with open(store, "ab") as fh:
        fh.write(msgspec.json.encode(note) + b"\n")
    return note


@tool
def remove(ctx: Context, id: Annotated[int, Field("The note's id", ge=1)]) -> str:  # noqa: A002
    """Remove one note by its id."""
    kept = [n for n in _read(ctx) if n.id != id]
    if len(kept) == len(_read(ctx)):
        raise ToolError(f"There is no note {id}; call `notes` to see the ids")
    _store(ctx).write_text("".join(json.dumps(msgspec.to_builtins(n)) + "\n" for n in kept), encoding="utf-8")
    return f"Removed note {id}"
