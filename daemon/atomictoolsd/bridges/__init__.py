"""Bridges: the agents' configuration shapes and the bridge scripts the daemon writes for them.

- ``agents``: each agent's MCP configuration (file, format, entry) that ``connect`` and the bridges
  write; no daemon state.
- ``scripts``: the daemon component behind ``atomic/bridges/*``: writes, lists and removes bridge
  scripts, keeps their manifest, and removes a bridge when its owner exits.

Never imported by the worker runtime, the client or the shim.
"""
