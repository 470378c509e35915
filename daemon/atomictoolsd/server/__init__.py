"""The daemon process: lifecycle, the listening socket, signals, and the one place it is assembled.

- ``wiring``: builds every component (pool, registry, watcher, monitor, bridges, service glue, …)
  and wires them together. Nothing else constructs or connects components.
- ``lifecycle``: ``Server``: ``startup()`` → ``main_loop()`` → ``shutdown()``, connections, status.
- ``socketfile``: the socket and lock files: the instance lock, binding, adopting, peer credentials.
- ``reconfigure``: SIGHUP: reload the configuration, apply it, rescan.
"""
