"""One connection speaking JSON-RPC: MCP's methods and the ``atomic/*`` ones.

- ``messages``: the envelope and each method's params as structs, decoded once; ``ParamsError``.
- ``session``: a connection: framing, writing, and the method handlers.
- ``dispatcher``: the meta-tools (``atomic_list_tools``, ``atomic_call``) offered instead of the tools.
- ``trust_refresh``: ``atomic/trust/refresh``.

Sessions reach the daemon through ``session.SessionHost``, never the server module itself.
"""
