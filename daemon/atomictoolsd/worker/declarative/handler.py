"""What every handler kind is: a tagged msgspec Struct whose fields are the keys a file gives its
``handler`` object (``type`` names the kind), and the call it makes.

The loader decodes a tool's handler as the union of the kinds (``loader.KINDS``), so msgspec checks
each key's type and range and refuses a key the kind does not have; ``__post_init__`` checks what a
type cannot say (a template's words, a URL's scheme) and prepares the call, raising
``TemplateError``. A field's ``Meta(description=...)`` is what the loader adds to msgspec's message
when that field is wrong. A new kind is one module with one subclass, named in ``loader.KINDS``.

Runs inside a worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

import msgspec

from atomictools._authoring import Context

__all__ = ["MAX_TIMEOUT_MS", "Handler", "TimeoutMs"]

MAX_TIMEOUT_MS = 3_600_000
TimeoutMs = Annotated[
    float, msgspec.Meta(ge=1, le=MAX_TIMEOUT_MS, description=f"milliseconds, from 1 to {MAX_TIMEOUT_MS}")
]


class Handler(msgspec.Struct, tag_field="type", forbid_unknown_fields=True, rename="camel", dict=True):
    """The base of the kinds: it has no field of its own."""

    # Set by each kind's ``__post_init__``; not fields (``dict=True`` holds them), so no file sets them.
    params: ClassVar[list[str]] = []  # the arguments the handler reads: the tool's inputSchema must declare them
    seconds: ClassVar[float | None] = None  # the handler's own timeout, when it has one
    # Where, relative to the caller's directory, it runs a program that may run what the directory
    # there holds (``"."``, ``"src"``): the daemon runs it only where the user trusts that
    # directory (``shell.ShellHandler``). None: it runs nothing of a caller's directory.
    needs_trusted_directory: ClassVar[str | None] = None

    def __call__(self, tool: str, args: dict[str, Any], ctx: Context) -> str:
        """Run one call of tool ``tool``; the result's text. Raises ``ToolError``."""
        raise NotImplementedError

    def derived_schema(self) -> dict[str, Any]:
        """The input schema of a tool whose file gives none: its placeholders, as required strings."""
        return {
            "type": "object",
            "properties": {p: {"type": "string"} for p in self.params},
            "required": list(self.params),
            "additionalProperties": False,
        }

    def default_annotations(self) -> dict[str, Any]:
        """The MCP annotations of a tool whose file gives none."""
        return {}

    def check_schema(self, schema: Mapping[str, Any]) -> None:
        """Refuse a schema (``$ref``s inlined) that leaves an argument freer than the handler
        allows. Raises ``TemplateError``."""

    def undeclared(self, param: str) -> str:
        """What is wrong when the schema does not declare ``param``."""
        return f"the handler uses {{{{{param}}}}} but inputSchema.properties does not declare {param!r}"
