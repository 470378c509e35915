"""Images in the project, for models that can see: show one, or delete one once the user agrees.

Copy into `.atomic/tools/` (or `~/.atomic/tools/`). `images` returns the file as an image result
(its type told from its bytes); `images_delete` asks the user to confirm through the agent
(`ctx.elicit`) and deletes nothing unless they accept. An agent that cannot ask its user gets an
error saying so, and the file stays.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from atomictools import Context, Field, Image, ToolError, tool

Path_ = Annotated[str, Field("Image file, relative to the project", min_length=1, max_length=1024)]


def _inside(ctx: Context, path: str) -> Path:
    root = Path(ctx.worktree or ctx.directory or os.getcwd()).resolve()
    target = (root / path).resolve()
    if root not in target.parents:
        raise ToolError(f"{path!r} is outside the project ({root})")
    if not target.is_file():
        raise ToolError(f"{path!r} is not a file in the project")
    return target


@tool(annotations={"readOnlyHint": True})
def images(ctx: Context, path: Path_) -> Image:
    """Show an image file of the project (PNG, JPEG, GIF, WebP, SVG, BMP)."""
    return Image(_inside(ctx, path))


@tool(timeout=300, annotations={"destructiveHint": True})
def delete(ctx: Context, path: Path_) -> str:
    """Delete an image file of the project, after the user confirms."""
    target = _inside(ctx, path)
    answer = ctx.elicit(f"Delete {path} ({target.stat().st_size:,} bytes)?")  # AskError if the agent cannot ask
    if not answer.accepted:
        return f"kept {path}: the user chose {answer.action}"
    target.unlink()
    return f"deleted {path}"
