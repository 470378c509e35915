"""What loading one module came to, as one typed union the registry's scan switches on.

A scan loads each changed module and commits every outcome in one step; between the two, the
outcomes are checked (was the file torn while a worker read it? does a failure repeat?) and some
are loaded again. Each case is its own small class, so a check or the commit matches on the case
instead of testing a tuple's shape, an exception's class or a sentinel's identity.

Data only: no loading, no committing (``projects`` does both).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from atomictoolsd.pool.pool import LoadFailure, SpawnError
from atomictoolsd.registry.cache import CacheEntry

if TYPE_CHECKING:
    from atomictoolsd.pool.worker import Worker

log = logging.getLogger(__name__)

__all__ = ["BLOCKED", "HELD", "Blocked", "Cached", "Held", "NotLoaded", "Late", "LoadOutcome", "Loaded", "NoWorker", "discard", "load_outcome"]


@dataclass(frozen=True, slots=True)
class Loaded:
    """A new worker generation loaded the module; not installed yet."""

    worker: Worker
    definitions: list[dict[str, Any]]
    load_ms: float


@dataclass(frozen=True, slots=True)
class NotLoaded:
    """The module failed to import or to build its tools, or its worker died while loading it."""

    failure: LoadFailure


@dataclass(frozen=True, slots=True)
class NoWorker:
    """No worker could be started to load it: not the module's doing."""

    error: SpawnError


@dataclass(frozen=True, slots=True)
class Cached:
    """Its definitions (or its failure) from the definition cache: no worker ran."""

    entry: CacheEntry


@dataclass(frozen=True, slots=True)
class Blocked:
    """A module of an untrusted dir: nothing ran."""


@dataclass(frozen=True, slots=True)
class Held:
    """A module whose content came through git, unreviewed, where it cannot run confined: nothing ran.
    ``deps``: the files it was found importing (a refused load's), when they are what holds it."""

    deps: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Late:
    """Its worker was still importing it when the scan's ``load_wait`` ran out."""

    task: asyncio.Future[LoadOutcome]


LoadOutcome = Loaded | NotLoaded | NoWorker | Cached | Blocked | Held | Late
BLOCKED = Blocked()
HELD = Held()


async def load_outcome(path: str, load: Any) -> LoadOutcome:
    """Await a runner's ``load()`` of the module at ``path``; its failures become values, not
    exceptions. A bug of the daemon's while loading one module is that module's load error (logged
    with its traceback, tried again at the next load), never a failed scan of every other module."""
    try:
        worker, definitions, load_ms = await load
    except LoadFailure as failure:
        return NotLoaded(failure)
    except SpawnError as error:
        return NoWorker(error)
    except Exception as exc:
        log.exception("loading %s failed on atomictoolsd's side", path)
        message = f"atomictoolsd could not load it: {type(exc).__name__}: {exc} (a bug of atomictoolsd's; its log has the traceback)"
        return NotLoaded(LoadFailure(path, None, message, by_module=False))
    return Loaded(worker, definitions, load_ms)


def discard(outcome: LoadOutcome) -> None:
    """Stop the worker generation of a load that will not be committed."""
    if isinstance(outcome, Loaded):
        outcome.worker.runner.drop(outcome.worker)
