"""Settings defaults have one home, ``Config``: the pool's limits and what a worker is told are built
from it in one place (``PoolSettings.from_config``), and a worker spec has no defaults of its own."""

from __future__ import annotations

import pytest

from atomictoolsd.config.settings import Config
from atomictoolsd.pool.pool import PoolSettings
from atomictoolsd.protocol import WorkerSpec


def test_a_worker_spec_has_no_limit_defaults_of_its_own() -> None:
    with pytest.raises(TypeError, match="threads"):
        WorkerSpec(path="m.py")  # type: ignore[call-arg]


def test_the_pools_defaults_are_the_configs() -> None:
    config = Config()
    settings = PoolSettings.from_config(spill_dir="/spill")
    spec = settings.worker_spec("/tools/m.py", "python", "/project")
    assert (settings.cancel_grace, settings.load_timeout) == (config.cancel_grace, config.load_timeout)
    assert spec.threads == config.worker_threads
    assert spec.memory_limit == config.memory_limit_mb * 1024 * 1024
    assert (spec.truncate_lines, spec.truncate_bytes) == (config.truncate_lines, config.truncate_bytes)
    assert spec.max_result_bytes == config.max_message_bytes
    assert (spec.path, spec.kind, spec.cwd, spec.spill_dir) == ("/tools/m.py", "python", "/project", "/spill")


def test_a_changed_setting_reaches_the_spec() -> None:
    spec = PoolSettings.from_config(Config(worker_threads=3, truncate_lines=7)).worker_spec("m.py", "python", "/")
    assert (spec.threads, spec.truncate_lines) == (3, 7)
