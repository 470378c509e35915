"""Service glue: running under systemd or launchd.

- ``notify``: the sd_notify protocol (READY, STATUS, WATCHDOG, RELOADING, STOPPING) written directly
  on ``NOTIFY_SOCKET``, and the component that sends it through the daemon's life.
- ``activation``: adopting the listening socket systemd (``LISTEN_FDS``) or launchd
  (``launch_activate_socket``) created, instead of binding one.
- ``manager``: which service manager started this process, for ``status``.
- ``units``: the unit files and the plist, filled in for this installation.
- ``install``: ``atomictoolsd service install|uninstall|status``.

Nothing here is imported by the worker runtime, the client or the shim.
"""
