"""The daemon's side of workers: it starts them, talks to them and watches them.

``pool`` (one runner per module: spawning, calling, timing out, cancelling and retiring workers),
``worker`` (one worker's channel and its calls in flight), ``spawner`` (asks a fork server for
workers), ``monitor`` (memory and idle limits), ``slots`` (workers at once), ``backoff`` (crash
streaks), ``netproxy`` (the one way out of a confined worker allowed the network) and
``javascript`` (the runtimes and support packages of TypeScript and JavaScript modules).

What runs inside a worker is ``atomictoolsd.worker``; what both sides say is ``atomictoolsd.protocol``.
Never imported by a worker.
"""
