"""A runner's spec is a value: what its next worker is told changes by a new spec, never in place, so
that a spec handed to a spawn, or compared with the one a worker was made from, stays what it was."""

from __future__ import annotations

import pytest

from atomictoolsd.pool.pool import PoolSettings, Unhosted, WorkerPool


def test_a_worker_spec_cannot_change_in_place() -> None:
    spec = PoolSettings.from_config().worker_spec("/tools/m.py", "python", "/project")
    with pytest.raises(AttributeError):
        spec.sandbox = {"read": [], "write": []}  # type: ignore[misc]


def test_setting_a_runner_up_gives_it_a_new_spec_and_leaves_the_old_one_as_it_was() -> None:
    pool = WorkerPool(PoolSettings.from_config())
    runner = pool.runner("/tools/m.py", "python", "/project")
    before = runner.spec
    policy = {"read": ["/project"], "write": []}
    runner.set_up(policy, {"m.py": "ab" * 32})
    assert before.sandbox is None and runner.spec.sandbox is policy
    assert runner.trusted_content == {"m.py": "ab" * 32}
    runner.set_up(policy, None)
    assert runner.spec.sandbox is policy and runner.trusted_content is None


def test_a_runner_nobody_lists_has_a_host_that_lets_every_worker_start() -> None:
    pool = WorkerPool(PoolSettings.from_config())
    assert isinstance(pool.runner("/tools/m.py", "python", "/project").host, Unhosted)

