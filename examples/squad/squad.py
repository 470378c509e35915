"""Squad's team-memory tools as atomictools tools: `squad_decide`, `squad_memory`, `squad_skill`.

They work on a Squad team directory (`.squad/`, or the older `.ai-team/`) at the project root:

- `squad_decide` drops a decision into `decisions/inbox/<author>-<slug>.md` for the Scribe to merge.
  It never overwrites: a second decision with the same slug gets `-2`, `-3`, …
- `squad_memory` adds a learning under `## Learnings` in `agents/<agent>/history.md`. Existing text
  is never changed: the entry is inserted at the end of that section (or the section is appended).
- `squad_skill` lists, reads and writes `skills/<name>/SKILL.md` (Agent Skills format: front matter
  with `name` and `description`). Replacing an existing skill needs `replace: true`.

Arguments are typed with constraints, so malformed calls are refused before a tool runs. Everything
that can go wrong afterwards comes back as a structured result, `{"ok": false, "error": {"code",
"message", "fix"}}`, which tells the model what to do next: these tools never raise.
"""

from __future__ import annotations

import fcntl
import functools
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from atomictools import Context, Field, tool

TEAM_DIRS = (".squad", ".ai-team")
SLUG = r"^[a-z0-9][a-z0-9-]{0,47}$"  # lower-case letters, digits and dashes


class Failure(msgspec.Struct):
    code: str
    message: str
    fix: str


class Decision(msgspec.Struct, omit_defaults=True):
    ok: bool
    path: str | None = None
    error: Failure | None = None


class Learning(msgspec.Struct, omit_defaults=True):
    ok: bool
    path: str | None = None
    entry: str | None = None
    error: Failure | None = None


class SkillSummary(msgspec.Struct):
    name: str
    description: str


class Skill(msgspec.Struct, omit_defaults=True):
    ok: bool
    skills: list[SkillSummary] | None = None
    name: str | None = None
    path: str | None = None
    content: str | None = None
    error: Failure | None = None


class _Fail(Exception):
    """Raised inside a tool body; becomes the ``error`` of a structured result."""

    def __init__(self, code: str, message: str, fix: str) -> None:
        super().__init__(message)
        self.failure = Failure(code=code, message=message, fix=fix)


R = TypeVar("R")


def _structured(result: Callable[..., R]) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Turn every failure of the tool body (ours, or the file system's) into ``result(ok=False, error=…)``."""

    def wrap(body: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(body)
        def tool_body(*args: Any, **kwargs: Any) -> R:
            try:
                return body(*args, **kwargs)
            except _Fail as exc:
                return result(ok=False, error=exc.failure)
            except OSError as exc:
                where = f" ({exc.filename})" if exc.filename else ""
                return result(ok=False, error=Failure(
                    "io_error", f"{exc.strerror or exc}{where}", "Check that the team directory is writable, then retry."))
            except Exception as exc:  # noqa: BLE001 - a model gets a result it can read, never a crash
                return result(ok=False, error=Failure(
                    "internal_error", f"{type(exc).__name__}: {exc}", "Report this; retrying will not help."))

        return tool_body

    return wrap


def _team(ctx: Context) -> Path:
    for base in dict.fromkeys(p for p in (ctx.directory, ctx.worktree) if p):
        for name in TEAM_DIRS:
            candidate = Path(base) / name
            if candidate.is_dir():
                return candidate
    raise _Fail("no_team", "No Squad team directory (.squad/ or .ai-team/) in this project.",
                "Initialise the team first (create .squad/ with agents/, decisions/ and skills/).")


def _slug(text: str, limit: int = 48) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit].strip("-")
    return slug or "untitled"


def _today() -> str:
    return time.strftime("%Y-%m-%d")


# -- squad_decide -----------------------------------------------------------------------------------


@tool(annotations={"destructiveHint": False, "idempotentHint": False})
@_structured(Decision)
def decide(
    ctx: Context,
    author: Annotated[str, Field("Who decided (the agent's name)", pattern=r"^[A-Za-z][A-Za-z0-9 _-]{0,39}$")],
    summary: Annotated[str, Field("The decision in one line", min_length=3, max_length=120)],
    body: Annotated[str, Field("What was decided, in detail", min_length=1, max_length=20000)],
    why: Annotated[str, Field("Why: the reasons and the alternatives rejected", max_length=5000)] | None = None,
    references: Annotated[list[Annotated[str, Field(max_length=200)]], Field("Related files, issues or decisions", max_length=20)] = [],  # noqa: B006,E501
) -> Decision:
    """Record a team decision in the decisions inbox, for the Scribe to merge into decisions.md.
    Never overwrites an earlier decision."""
    inbox = _team(ctx) / "decisions" / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    lines = [f"### {_today()}: {summary.strip()}", f"**By:** {author}", f"**What:** {body.strip()}"]
    if why:
        lines.append(f"**Why:** {why.strip()}")
    if references:
        lines.append(f"**References:** {', '.join(references)}")
    text = "\n".join(lines) + "\n"
    stem = f"{_slug(author, 24)}-{_slug(summary)}"
    for attempt in range(1, 100):
        path = inbox / (f"{stem}.md" if attempt == 1 else f"{stem}-{attempt}.md")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # O_EXCL: never overwrite
        except FileExistsError:
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        return Decision(ok=True, path=str(path.relative_to(_team(ctx).parent)))
    raise _Fail("inbox_full", f"99 decisions already use the slug {stem!r}.",
                "Use a more specific summary, or ask the Scribe to merge the inbox.")


# -- squad_memory -----------------------------------------------------------------------------------

_LEARNINGS = re.compile(r"^##\s+Learnings\s*$", re.MULTILINE | re.IGNORECASE)
_NEXT_SECTION = re.compile(r"^#{1,2}\s", re.MULTILINE)


@tool(annotations={"destructiveHint": False})
@_structured(Learning)
def memory(
    ctx: Context,
    agent: Annotated[str, Field("The agent who learned it (its directory under agents/)", pattern=SLUG)],
    learning: Annotated[str, Field("What was learned, in a sentence or a short paragraph", min_length=3, max_length=4000)],
) -> Learning:
    """Teach an agent something permanent: add it under `## Learnings` in the agent's history.md.
    Append-only: nothing already written is changed."""
    agents = _team(ctx) / "agents"
    home = agents / agent
    if not home.is_dir():
        known = sorted(p.name for p in agents.iterdir() if p.is_dir()) if agents.is_dir() else []
        raise _Fail("unknown_agent", f"There is no agent {agent!r} in {agents}.",
                    f"Use one of: {', '.join(known)}." if known else "Create the agent's directory first.")
    history = home / "history.md"
    entry = f"- **{_today()}:** " + learning.strip().replace("\n", "\n  ")
    fd = os.open(history, os.O_RDWR | os.O_CREAT, 0o644)
    with os.fdopen(fd, "r+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # two agents learning at once must not lose an entry
        original = fh.read().decode("utf-8")
        heading = _LEARNINGS.search(original)
        if heading is None:  # no such section yet: append one
            at = len(original)
            lead = "" if not original else "\n" if original.endswith("\n") else "\n\n"
            addition = (f"# {agent}\n\n" if not original else lead) + f"## Learnings\n\n{entry}\n"
        else:  # insert after the section's last line, before the blank lines and the next section
            following = _NEXT_SECTION.search(original, heading.end())
            section = original[: following.start() if following else len(original)].rstrip()
            at = len(section)
            addition = ("\n" if section[heading.end():].strip() else "\n\n") + entry
            if at == len(original):
                addition += "\n"
        tail = original[at:]
        fh.seek(len(original[:at].encode("utf-8")))
        fh.write((addition + tail).encode("utf-8"))
    return Learning(ok=True, path=str(history.relative_to(_team(ctx).parent)), entry=entry)


# -- squad_skill ------------------------------------------------------------------------------------

_FRONT_MATTER = re.compile(r"\A---\n(.*?)\n---\n", re.DOTALL)
_SKILL_TEMPLATE = "---\nname: <name>\ndescription: <when to use this skill>\n---\n\n# <Title>\n\n<instructions>"


def _front_matter(text: str) -> dict[str, str]:
    match = _FRONT_MATTER.match(text.replace("\r\n", "\n"))
    if match is None:
        return {}
    fields = {}
    for line in match.group(1).splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and not key.startswith((" ", "\t")):
            fields[key.strip()] = value.strip().strip("\"'")
    return fields


@tool
@_structured(Skill)
def skill(
    ctx: Context,
    action: Annotated[Literal["list", "read", "write"], Field("list the skills, read one, or write one")],
    name: Annotated[str, Field("The skill's name (its directory under skills/)", pattern=SLUG)] | None = None,
    content: Annotated[str, Field("For write: the whole SKILL.md, front matter first", max_length=100_000)] | None = None,
    replace: Annotated[bool, Field("For write: replace an existing skill")] = False,
) -> Skill:
    """List, read or write the team's skills (skills/<name>/SKILL.md, Agent Skills format)."""
    skills = _team(ctx) / "skills"
    if action == "list":
        found = []
        for path in sorted(skills.glob("*/SKILL.md")) if skills.is_dir() else []:
            meta = _front_matter(path.read_text(encoding="utf-8", errors="replace"))
            found.append(SkillSummary(name=path.parent.name, description=meta.get("description", "")))
        return Skill(ok=True, skills=found)
    if name is None:
        raise _Fail("missing_argument", f"action {action!r} needs a skill name.",
                    "Pass name; call with action='list' to see the skills.")
    path = skills / name / "SKILL.md"
    relative = str(path.relative_to(_team(ctx).parent))
    if action == "read":
        if not path.is_file():
            raise _Fail("not_found", f"There is no skill {name!r}.", "Call with action='list' to see the skills.")
        return Skill(ok=True, name=name, path=relative, content=path.read_text(encoding="utf-8", errors="replace"))
    if content is None:
        raise _Fail("missing_argument", "action 'write' needs content.", f"Pass content shaped like:\n{_SKILL_TEMPLATE}")
    meta = _front_matter(content)
    if not meta.get("name") or not meta.get("description"):
        raise _Fail("invalid_skill", "SKILL.md must start with front matter giving name and description.",
                    f"Start the content like this:\n{_SKILL_TEMPLATE}")
    if meta["name"] != name:
        raise _Fail("invalid_skill", f"The front matter names the skill {meta['name']!r}, not {name!r}.",
                    f"Set `name: {name}` in the front matter, or write to name={meta['name']!r}.")
    if path.exists() and not replace:
        raise _Fail("exists", f"The skill {name!r} exists already.",
                    "Read it first (action='read'), then write again with replace=true to replace it.")
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".SKILL.md.{os.getpid()}")
    temporary.write_text(content if content.endswith("\n") else content + "\n", encoding="utf-8")
    os.replace(temporary, path)  # readers see the old skill or the new one, never half of it
    return Skill(ok=True, name=name, path=relative)
