"""``SetupError``: the one base of the errors the daemon meets while it is being set up.

A bad setting (``settings.ConfigError``), an unusable path, runtime dir or socket file
(``paths.PathError``), a listening address that cannot be served (``transports.http.AddressError``),
a socket the service manager passed that cannot be served on (``service.activation.ActivationError``).
Each message says what to fix; the CLI catches this base once (``cli.main``) and prints it as one
line, without a traceback, exiting with ``exit_code``.
"""

from __future__ import annotations

__all__ = ["SetupError"]


class SetupError(Exception):
    """The daemon cannot be set up as configured; the message says what to fix.

    Attributes:
        what: a few words the CLI puts before the message (``bad configuration``), or ``""``.
        exit_code: the CLI's exit code for it (2 for a bad configuration, as ``--help`` says).
    """

    what = ""
    exit_code = 1

    def report(self) -> str:
        """The line the CLI prints (after ``atomictoolsd: ``)."""
        return f"{self.what}: {self}" if self.what else str(self)
