"""Everything that runs in a worker process or a fork server, and nothing the daemon runs.

The runtime: ``main`` (a worker's entry: load one module, serve its calls), ``forkserver`` (the
process that forks workers with ``main`` imported), ``loading``, ``scheduling`` and ``sender`` (the
call path inside a worker), ``sourceload``, ``output``, ``results``, ``blocks``, ``truncate``,
``limits``, ``arguments``, ``environment``, ``removal``; confinement: ``sandbox``, ``netns``,
``gitindex``; a TypeScript or JavaScript module's worker: ``jsexec`` and the program it runs,
``js/``. The tool kinds that run here: ``declarative`` (``.json`` tool files) and ``builtins`` (the
built-in tools, loaded by path as any tools dir).

Standard library, msgspec and atomictools, ``atomictoolsd.protocol`` (what the daemon and a worker
say) and ``atomictoolsd.util``: never uvloop, watchfiles, psutil, the event log, the configuration or
anything else of the daemon's side (``tests/unit/test_boundaries.py``; the built-in tools are tools,
and may read the configuration and the trust store they report). The daemon imports of this package
only the few probes and constants that test lists, each with its reason.
"""
