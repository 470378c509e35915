"""Tool workers: one subprocess per tool module.

Daemon side: ``pool`` (one runner per module: spawning, calling, timing out, cancelling and retiring
workers), ``worker`` (one worker's channel and its calls in flight), ``spawner`` (asks the fork server
for workers), ``monitor`` (memory and idle limits), ``slots`` (workers at once), ``backoff`` (crash streaks),
``periodic`` (the one timer-loop shape) and ``processes`` (the one stop-and-wait).

``protocol`` is what both sides speak: the framing, ``WorkerSpec`` and ``LoadFailure``.
``runtime`` is the code inside a worker and the fork server (standard library + msgspec +
atomictools only): it never imports the daemon side.
"""
