"""Transports beside the Unix socket: each carries a ``Session``'s JSON-RPC over another wire.

A transport owns framing, routing and its own security checks; the protocol (methods, revisions,
what a client may see) stays in ``atomictoolsd.sessions``. ``http``: MCP's Streamable HTTP, on
``http1``: HTTP/1.1 connections (httptools' parser), with no MCP in them.
"""
