"""Tool workers: one subprocess per tool module.

``runtime`` is the code inside a worker (standard library + msgspec + atomictools only);
``forkserver`` starts workers by forking a process that has the runtime pre-imported; ``pool``
is the daemon's side: spawning, calling, timing out, cancelling and retiring workers.
"""
