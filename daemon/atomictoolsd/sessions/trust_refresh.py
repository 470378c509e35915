"""``atomic/trust/refresh``: re-read the trust store and load, or block, every project whose trust
changed, and load again every one whose environment changed (``trust --python``), telling attached
sessions (``tools/list_changed``).

``atomictoolsd trust`` and ``untrust`` call it after writing the store, so trusting takes effect
without a restart. The store itself is ``registry/trust.py``; this module only answers the method.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec

from atomictoolsd.registry.model import ToolsDir
from atomictoolsd.sessions.session import Handler, Session

__all__ = ["trust_refresh_method"]


def trust_refresh_method(refresh_trust: Callable[[], Awaitable[Sequence[ToolsDir]]]) -> Handler:
    """The handler of ``atomic/trust/refresh``, given the registry's ``refresh_trust``."""

    async def refresh(session: Session, id_json: bytes) -> None:
        changed = await refresh_trust()
        # A project's own tools only: its built-in dirs are re-judged at every trust change too,
        # but always load, and would say "trusted" for a project just untrusted.
        result = {"changed": [{"root": str(d.cwd), "trusted": d.trusted} for d in changed if d.scope == "local"]}
        session.send_result(id_json, msgspec.json.encode(result))

    def on_refresh(session: Session, id_json: bytes, raw: Any) -> Awaitable[None]:
        return refresh(session, id_json)

    return on_refresh
