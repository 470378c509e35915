"""Who is at the other end of a TCP connection from this machine: the uid owning the peer's socket.

A Unix socket tells its peer's uid (``SO_PEERCRED``); TCP does not. But a connection from this
machine has both ends in this kernel, and on Linux ``sock_diag`` (the netlink interface ``ss``
uses) finds a socket by its four addresses and says which uid owns it: one request and one answer,
without walking the machine's socket table. ``PeerOwners.uid`` asks it for the client end of an
accepted connection (whose local address and port are the connection's peer, and whose remote ones
are ours). It answers None where it cannot tell: not Linux, a peer on another machine, a socket gone
since (or one in TIME_WAIT, which the kernel reports without an owner).

Imported only when HTTP is on, with ``transports/http.py``. Standard library only.
"""

from __future__ import annotations

import itertools
import logging
import socket
import struct

__all__ = ["PeerOwners"]

log = logging.getLogger("atomictoolsd.http")

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLMSG_ERROR = 2
_NLM_F_REQUEST = 1
_NO_COOKIE = 0xFFFFFFFF
_TCP_TIME_WAIT = 6
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
# inet_diag_req_v2: family, protocol, ext, pad, states; then inet_diag_sockid: ports (network
# order), source and destination addresses (16 bytes each), interface, cookie.
_REQUEST = struct.Struct("=BBBBI")
_SOCKID = struct.Struct(">HH16s16s")
_SOCKID_TAIL = struct.Struct("=III")
# inet_diag_msg: family, state, timer, retransmits, the sockid (48 bytes), expires, rqueue, wqueue,
# uid, inode.
_ANSWER = struct.Struct("=BBBB48xIIIII")


class PeerOwners:
    """Looks up the owner of a connection's peer socket (Linux); one netlink socket for its life."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._sequence = itertools.count(1)
        try:
            self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, _NETLINK_SOCK_DIAG)
        except (AttributeError, OSError) as exc:  # AttributeError: no AF_NETLINK (not Linux)
            log.debug("http: cannot look up the owners of connections (%s)", exc)

    @property
    def available(self) -> bool:
        return self._sock is not None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def uid(self, sock: socket.socket) -> int | None:
        """The uid owning the other end of the accepted TCP connection ``sock``; None when unknown."""
        if self._sock is None:
            return None
        try:
            ours, theirs = sock.getsockname(), sock.getpeername()
        except OSError:
            return None
        family = sock.family
        if family not in (socket.AF_INET, socket.AF_INET6):
            return None
        sequence = next(self._sequence) & 0xFFFFFFFF
        try:
            self._sock.send(_request(family, theirs, ours, sequence))
            return self._answer(sequence)
        except OSError as exc:
            log.debug("http: the owner of a connection could not be looked up: %s", exc)
            return None

    def _answer(self, sequence: int) -> int | None:
        """The answer to request ``sequence``: the kernel queues it before ``send`` returns."""
        assert self._sock is not None
        while True:
            try:
                data = self._sock.recv(8192, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return None
            if len(data) < _HEADER.size:
                return None
            _length, kind, _flags, seq, _port = _HEADER.unpack_from(data)
            if seq != sequence:
                continue  # the late answer to an earlier request
            if kind == _NLMSG_ERROR or len(data) < _HEADER.size + _ANSWER.size:
                return None  # not found (ENOENT): a peer elsewhere, or gone
            _family, state, _timer, _retrans, _expires, _rq, _wq, uid, _inode = _ANSWER.unpack_from(data, _HEADER.size)
            return None if state == _TCP_TIME_WAIT else uid


def _request(family: int, local: tuple, remote: tuple, sequence: int) -> bytes:  # type: ignore[type-arg]
    """A SOCK_DIAG_BY_FAMILY request for the TCP socket whose own address is ``local`` and whose
    peer is ``remote`` (the client end, seen from the client)."""
    body = (
        _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF)
        + _SOCKID.pack(local[1], remote[1], _address(family, local[0]), _address(family, remote[0]))
        + _SOCKID_TAIL.pack(0, _NO_COOKIE, _NO_COOKIE)
    )
    return _HEADER.pack(_HEADER.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, sequence, 0) + body


def _address(family: int, host: str) -> bytes:
    packed = socket.inet_pton(family, host.partition("%")[0])
    return packed.ljust(16, b"\0")

