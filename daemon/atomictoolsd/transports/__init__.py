"""Transports beside the Unix socket: each carries a ``Session``'s JSON-RPC over another wire.

A transport owns framing, routing and its own security checks; the protocol (methods, revisions,
what a client may see) stays in ``atomictoolsd.sessions``. ``http``: MCP's Streamable HTTP.
"""
