"""atomictoolsd: a per-user daemon serving tool modules to AI coding agents.

Kept free of imports: the worker runtime and the stdio shim live in this package and must start
without paying for the server's dependencies.
"""

__version__ = "0.2.0"
