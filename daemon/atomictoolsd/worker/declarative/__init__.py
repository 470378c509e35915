"""Declarative tool files: ``*.json`` in a tools dir, whose tools run a command (``shell``), make an
HTTP request (``http``) or read a file (``file-read``) without any Python from the user.

Each file is a tool module like a ``.py`` file: it loads in a worker of its own (this package runs
only there), and reloads when it changes. ``loader`` decodes the file with msgspec; each handler
kind is one Struct in a module of its own (``handler`` says what every kind is, ``loader.KINDS``
names them) that checks its keys and does the work; ``validation`` checks arguments against each
tool's ``inputSchema``.
"""

from atomictoolsd.worker.declarative.loader import load_file

__all__ = ["load_file"]
