"""The event log: one JSON line per event in ``atomictoolsd.log``.

- ``writer``: the daemon's writer (buffered, rotated, flushed off the event loop) and the logging
  handlers that feed it.
- ``reader``: reading and following the files, for ``atomictoolsd logs``.

Its level names are ``config/levels.py`` (the ``log_level`` setting accepts them).

Just above ``config`` (it uses its escaping and levels); the worker runtime never imports it.
"""
