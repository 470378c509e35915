"""The code inside a worker: ``main`` (load a module, serve calls), ``forkserver`` (the process that
forks workers with ``main`` pre-imported), ``schema`` (a tool's schemas and argument decoder from
its signature; ``signature``, ``pydantic_schema`` and ``portable`` beside it), ``sourceload`` (reading sources and helpers whole),
``output`` (stdout/stderr capture), ``truncate`` (large results), ``limits`` (memory limit),
``sandbox`` (confining a worker), ``arguments`` (undeclared arguments),
``procgroups`` (killing a worker's process group) and ``procstat`` (``/proc/PID/stat``): the
spawner and the CLI use these two too.

Standard library + msgspec + atomictools only: never uvloop, watchfiles, psutil, the event log, the
configuration or anything else of the daemon side.
"""
