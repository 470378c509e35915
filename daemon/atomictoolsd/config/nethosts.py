"""The hosts a confined tool with the network may reach: the names the user writes, read and matched.

``trust --sandbox --allow-net HOST,…`` names the hosts one project's tools may reach through the
daemon's proxy (``pool/netproxy.py``); ``sandbox_allow_net_private`` names the hosts and networks
of the user's own network that confined tools may reach at all (a private address is refused
otherwise). Both are read here, by the CLI, the daemon and the proxy alike, so a name means the
same thing everywhere.

A host is a DNS name (``example.com``), a wildcard (``*.example.com``: any name below it, not
``example.com`` itself) or an IP address (``192.0.2.7``, ``2001:db8::1`` or ``[2001:db8::1]``).
Names are compared in lower case, without a final dot, and in their ASCII (IDNA) form. A network
(``10.1.0.0/16``) is allowed only in ``sandbox_allow_net_private``, where it matches the addresses a
name resolves to. Loopback, unspecified and multicast addresses can never be named there: the
proxy never reaches them (nor this machine's own addresses), whatever the configuration says.

Standard library only.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

__all__ = ["host_matches", "normal_host", "parse_hosts", "parse_private", "private_allows"]

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def normal_host(host: str) -> str:
    """``host`` as it is compared: lower case, no final dot, an IPv6 address without brackets and
    in its short form, a name in its ASCII (IDNA) form.

    Raises:
        ValueError: it is not a host name nor an IP address.
    """
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    name = host.rstrip(".").lower() if host != "." else ""
    if not name.isascii():
        try:
            name = name.encode("idna").decode("ascii")
        except UnicodeError:
            raise ValueError(f"{host!r} is not a host name") from None
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise ValueError(f"{host!r} is not a host name (letters, digits, '-' and '.', or an IP address)")
    return name


def _split(value: str | Iterable[str]) -> list[str]:
    items = value.split(",") if isinstance(value, str) else list(value)
    return [item.strip() for item in items if item and item.strip()]


def _pattern(item: str) -> str:
    if item.startswith("*."):
        rest = normal_host(item[2:])
        if _address(rest) is not None:
            raise ValueError(f"{item!r}: a wildcard stands for names, not addresses")
        return "*." + rest
    return normal_host(item)


def parse_hosts(value: str | Iterable[str]) -> list[str]:
    """The hosts of ``--allow-net HOST,…`` (commas between them), normalised and sorted.

    Raises:
        ValueError: one of them is not a host, a wildcard or an address; or none is given.
    """
    hosts = sorted({_pattern(item) for item in _split(value)})
    if not hosts:
        raise ValueError("name at least one host (example.com, *.example.com or an address)")
    return hosts


def parse_private(value: str | Iterable[str]) -> list[str]:
    """The entries of ``sandbox_allow_net_private``: hosts as in ``parse_hosts`` and networks
    (``10.1.0.0/16``), normalised; empty for an empty value.

    Raises:
        ValueError: an entry is none of these, or names loopback, unspecified or multicast addresses.
    """
    entries = []
    for item in _split(value):
        if "/" in item:
            try:
                network = ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not a network (such as 10.1.0.0/16)") from None
            _refuse_special(item, network)
            entries.append(str(network))
        else:
            pattern = _pattern(item)
            address = _address(pattern)
            if address is not None:
                _refuse_special(item, ipaddress.ip_network(address))
            entries.append(pattern)
    return sorted(set(entries))


def _refuse_special(item: str, network: _Network) -> None:
    for kind in ("loopback", "unspecified", "multicast"):
        if getattr(network, f"is_{kind}") or getattr(network.network_address, f"is_{kind}"):
            raise ValueError(f"{item!r} is a {kind} address: a confined tool never reaches it")


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def host_matches(host: str, patterns: Iterable[str]) -> bool:
    """Whether ``host`` (normalised) is one of ``patterns`` or below one of their wildcards."""
    for pattern in patterns:
        if pattern == host or (pattern.startswith("*.") and host.endswith(pattern[1:])):
            return True
    return False


def private_allows(entries: Iterable[str], host: str, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``sandbox_allow_net_private`` (``entries``) lets a tool reach ``address``, which
    ``host`` resolved to: by the host's name, or by a network or address that holds it."""
    for entry in entries:
        if "/" in entry:
            network = ipaddress.ip_network(entry)
            if address.version == network.version and address in network:
                return True
        elif entry == str(address) or host_matches(host, (entry,)):
            return True
    return False
