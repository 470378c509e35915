"""The bottom of the daemon side: how it is configured and where things are on disk.

- ``settings``: ``Config`` and ``load_config`` (defaults, ``config.toml``, ``ATOMICTOOLS_*``).
- ``paths``: the daemon's own files and dirs (socket, lock, state, cache, logs), and their checks.
- ``discovery``: where tool modules are (project roots, tools dirs, the module files in them).
- ``levels``: the log level names and ranks (``log_level``, the event log, ``logs --level``).
- ``errors``: ``SetupError``, the base of every error of setting the daemon up (config, paths,
  addresses, an inherited socket), which the CLI prints as one line.
- ``statefile``: writing a state file whole or not at all (trust store, manifests, caches, units).
- ``command``: how the user runs this installation, for messages that print a command.
- ``suggest``: "did you mean" for unknown settings and tools.

Imports nothing else of the daemon. Every daemon-side layer may use it; the worker runtime does not.
"""
