"""Which tools exist: projects, tools dirs, precedence, generations, and the trust store.

- ``model``: the types: ``ToolDef``, ``Module``, ``ToolsDir``, ``Project``, ``View``, ``Change``.
- ``projects``: ``Registry``, the face of three parts: ``lifetimes`` (the projects in use and how
  each dir may run: trust, confinement, held content), ``scanning`` (scans and loads tools dirs
  through the pool, and checks that each load read what is on disk) and ``commits`` (commits what
  loaded in one step, keeps the definition cache, tells listeners what changed).
- ``cache``: definitions of unchanged modules, kept across restarts.
- ``trust``: the trust store (``trust.json``).
- ``watcher`` and ``inotify``: reload a module when its file or a helper changes.
- ``idle``: forget projects nobody has held for ``idle_timeout``.
- ``confinement``: how each tools dir may run: full rights, confined (``trust --sandbox``), or not.

Knows nothing of sockets or sessions: it tells its listeners, and the server passes the news on.
"""
