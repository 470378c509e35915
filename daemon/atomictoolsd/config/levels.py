"""The daemon's own log levels: Python logging's names, for the event log and its settings.

These are not MCP's levels. Tools and clients exchange the syslog severities
(``atomictools._protocol.LOG_LEVELS``: debug … notice … emergency) in ``notifications/message``
and ``logging/setLevel``; the daemon writes its own records (Python logging's debug … critical) to
the event log, and ``log_level`` and ``atomictoolsd logs --level`` choose among those.

Imports nothing, so the CLI can build its parser with these names at no cost.
"""

__all__ = ["DAEMON_LOG_LEVELS", "LEVEL_RANK"]

# Python logging's numbers, least severe first. "critical" arrives only from logging records.
LEVEL_RANK = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}

# The least severe level a user may ask the event log (or `atomictoolsd logs`) to show.
DAEMON_LOG_LEVELS = ("debug", "info", "warning", "error")
