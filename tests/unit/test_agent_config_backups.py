"""Every change to an agent's config keeps what the file held before, in a backup of its own."""

from __future__ import annotations

import json
from pathlib import Path

from atomictoolsd.bridges.agents import update_json


def test_changes_in_the_same_second_keep_every_earlier_content(tmp_path: Path) -> None:
    config = tmp_path / "settings.json"
    config.write_text('{"version": 0}')
    backups = tmp_path / "backups"
    kept = []
    for version in range(1, 5):  # well within one second: the backups' names share their stamp
        outcome = update_json(config, lambda document, v=version: document.update(version=v) or True, backup_dir=backups)
        kept.append(outcome.backup)
    assert len(set(kept)) == 4, kept
    assert [json.loads(path.read_text())["version"] for path in kept] == [0, 1, 2, 3]
    assert json.loads(config.read_text())["version"] == 4
    assert all(path.stat().st_mode & 0o777 == 0o600 for path in kept)
