"""The environments tool modules import from besides the daemon's own: the packages a module
declares (PEP 723, built by the daemon: ``store``, ``installer``, ``script``).

Daemon side, beside the registry: the worker pool asks ``Environments.for_runner`` before each
worker of a module starts, and the worker puts what it answers on its ``sys.path``
(``worker/environment.py``). Never imported by a worker.
"""

from atomictoolsd.environments.store import Environments

__all__ = ["Environments"]
