"""A tool returning structured data: lines of code by language.

The return annotation (`LocReport`, a msgspec Struct) becomes the tool's `outputSchema`, and each
result carries the same JSON as `structuredContent`, so a client can use the numbers directly.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import msgspec

from atomictools import Context, Field, ToolError, tool

LANGUAGES = {
    ".py": "Python", ".js": "JavaScript", ".ts": "TypeScript", ".go": "Go", ".rs": "Rust",
    ".c": "C", ".h": "C", ".java": "Java", ".rb": "Ruby", ".sh": "Shell", ".md": "Markdown",
    ".json": "JSON", ".toml": "TOML", ".yaml": "YAML", ".yml": "YAML",
}
SKIP_DIRS = {".git", ".hg", ".venv", "venv", "node_modules", "__pycache__", "dist", "build"}


class Language(msgspec.Struct):
    language: str
    files: int
    lines: int


class LocReport(msgspec.Struct):
    root: str
    files: int
    lines: int
    languages: list[Language]


@tool(annotations={"readOnlyHint": True})
def loc(
    ctx: Context,
    path: Annotated[str, Field("Directory to count, relative to the project", min_length=1, max_length=1024)] = ".",
) -> LocReport:
    """Count files and lines of code by language, largest first (hidden and build dirs skipped)."""
    root = Path(ctx.worktree or ctx.directory or os.getcwd()).resolve()
    top = (root / path).resolve()
    if top != root and root not in top.parents:
        raise ToolError(f"{path!r} is outside the project ({root})")
    if not top.is_dir():
        raise ToolError(f"{path!r} is not a directory")
    counts: dict[str, list[int]] = {}
    for directory, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")]
        for name in files:
            language = LANGUAGES.get(os.path.splitext(name)[1])
            if language is None:
                continue
            try:
                with open(os.path.join(directory, name), "rb") as fh:
                    lines = sum(1 for _ in fh)
            except OSError:
                continue
            entry = counts.setdefault(language, [0, 0])
            entry[0] += 1
            entry[1] += lines
    languages = sorted(
        (Language(language=k, files=v[0], lines=v[1]) for k, v in counts.items()), key=lambda x: (-x.lines, x.language)
    )
    return LocReport(
        root=str(top),
        files=sum(x.files for x in languages),
        lines=sum(x.lines for x in languages),
        languages=languages,
    )
