"""The revision table (sessions/revisions.py): what each MCP revision's clients may be sent."""

from __future__ import annotations

import pytest

from atomictoolsd.sessions.revisions import ALL, BY_VERSION, LATEST, STATELESS_REVISION, negotiate, revision


def test_each_revision_has_exactly_its_features() -> None:
    oldest, march, june, november = (BY_VERSION[v] for v in ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"))
    assert oldest.tool_fields_dropped == {"annotations", "title", "outputSchema", "_meta", "icons", "execution"}
    assert march.tool_fields_dropped == {"title", "outputSchema", "_meta", "icons", "execution"}
    assert june.tool_fields_dropped == {"icons", "execution"}
    assert november.tool_fields_dropped == frozenset()
    assert oldest.blocks == {"text", "image", "resource"}
    assert march.blocks == {"text", "image", "resource", "audio"}
    assert june.blocks == november.blocks == {"text", "image", "resource", "audio", "resource_link"}
    assert [r.structured_content for r in (oldest, march, june, november)] == [False, False, True, True]
    assert [r.full_results for r in (oldest, march, june, november)] == [False, False, True, True]
    assert [r.progress_message for r in (oldest, march, june, november)] == [False, True, True, True]
    assert [r.server_title for r in (oldest, march, june, november)] == [False, False, True, True]
    assert oldest.asks == march.asks == {"sampling/createMessage"}
    assert june.asks == november.asks == {"sampling/createMessage", "elicitation/create"}
    assert [r.elicitation_forms for r in (oldest, march, june, november)] == [False, False, False, True]
    assert not any(r.stateless for r in (oldest, march, june, november))
    assert [r.batches for r in (oldest, march, june, november)] == [False, True, False, False]


def test_the_stateless_revision_takes_everything() -> None:
    assert STATELESS_REVISION.version == "2026-07-28" and STATELESS_REVISION.stateless
    assert STATELESS_REVISION.full_results and not STATELESS_REVISION.tool_fields_dropped
    assert STATELESS_REVISION.asks == {"sampling/createMessage", "elicitation/create"}  # through input_required
    assert STATELESS_REVISION.elicitation_forms
    assert not STATELESS_REVISION.batches  # 2025-06-18 removed them


def test_negotiation_answers_the_clients_revision_else_the_newest_stateful_one() -> None:
    for version in ALL[:-1]:
        assert negotiate(version).version == version
    assert negotiate("2099-01-01").version == LATEST
    assert negotiate("2026-07-28").version == LATEST  # the stateless revision has no initialize
    assert revision("2031-01-01") is None and revision("2025-06-18") is BY_VERSION["2025-06-18"]


def test_a_revision_is_a_frozen_value() -> None:
    with pytest.raises(AttributeError):
        BY_VERSION["2025-06-18"].stateless = True  # type: ignore[misc]
