"""What the proxy of confined workers lets through, judged without a network: the hosts a user
names (``config/nethosts.py``), the addresses no confined tool reaches, and how a request's head is
read and passed on (``pool/netproxy.py``). The proxy itself, on real namespaces and sockets, is
``tests/reliability/test_sandbox_net.py``."""

from __future__ import annotations

import ipaddress

import pytest

from atomictoolsd.config.nethosts import host_matches, normal_host, parse_hosts, parse_private
from atomictoolsd.pool.netproxy import ProxyRefusal, _Request, address_refusal


def test_hosts_are_read_as_the_user_means_them() -> None:
    assert parse_hosts("PyPI.org., *.GitHub.com, 192.0.2.7,[2001:DB8::1]") == [
        "*.github.com", "192.0.2.7", "2001:db8::1", "pypi.org"]
    assert parse_hosts(["bücher.example"]) == ["xn--bcher-kva.example"]
    for bad in ("exa mple.com", "-a.com", "a..com", "*.192.0.2.7", "", "http://a.com"):
        with pytest.raises(ValueError):
            parse_hosts(bad)
    hosts = parse_hosts("*.github.com,pypi.org")
    assert host_matches("api.github.com", hosts) and host_matches("a.b.github.com", hosts)
    assert not host_matches("github.com", hosts), "a wildcard is for the names below"
    assert not host_matches("evilgithub.com", hosts) and not host_matches("pypi.org.evil.com", hosts)
    assert normal_host("[2001:DB8:0::1]") == "2001:db8::1"


def test_the_user_cannot_open_loopback_or_this_machine_to_confined_tools() -> None:
    assert parse_private("git.corp.lan, 10.1.0.0/16,fd00::/8") == ["10.1.0.0/16", "fd00::/8", "git.corp.lan"]
    for bad in ("127.0.0.1", "127.0.0.0/8", "::1", "0.0.0.0", "0.0.0.0/0", "224.0.0.1", "10.0.0.0/33"):
        with pytest.raises(ValueError):
            parse_private(bad)


@pytest.mark.parametrize(("address", "why"), [
    ("8.8.8.8", None), ("2606:4700::1111", None), ("::ffff:8.8.8.8", None),
    ("127.0.0.1", "loopback"), ("127.1.2.3", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"), ("224.0.0.1", "multicast"), ("ff02::1", "multicast"),
    ("10.0.0.1", "private"), ("192.168.1.1", "private"), ("172.16.0.1", "private"), ("100.64.0.1", "private"),
    ("169.254.169.254", "private"), ("fe80::1", "private"), ("fd12::1", "private"),
    ("64:ff9b::a00:1", "private"), ("2002:a00:1::", "private"), ("64:ff9b::7f00:1", "loopback"),
])
def test_the_addresses_no_confined_tool_reaches(address: str, why: str | None) -> None:
    refusal = address_refusal(ipaddress.ip_address(address), "host.example", [])
    assert (refusal is None) if why is None else (refusal is not None and why in refusal), refusal


def test_the_users_private_hosts_open_their_own_network_only() -> None:
    private = parse_private("10.1.0.0/16,git.corp.lan")
    assert address_refusal(ipaddress.ip_address("10.1.2.3"), "build.lan", private) is None
    assert address_refusal(ipaddress.ip_address("10.2.0.1"), "git.corp.lan", private) is None, "by its name"
    assert address_refusal(ipaddress.ip_address("10.2.0.1"), "other.lan", private) is not None
    assert "loopback" in str(address_refusal(ipaddress.ip_address("127.0.0.1"), "git.corp.lan", private))


def test_a_plain_request_goes_to_the_host_it_names_and_no_other() -> None:
    head = (b"GET http://Example.COM:8080/a?b=1 HTTP/1.1\r\nHost: other.example\r\nProxy-Connection: keep-alive\r\n"
            b"Proxy-Authorization: Basic eA==\r\nConnection: X-Hop\r\nX-Hop: 1\r\nAccept: */*\r\n\r\n")
    request = _Request.parse(head)
    assert (request.method, request.host, request.port) == ("GET", "example.com", 8080)
    assert request.forwarded_head() == (b"GET /a?b=1 HTTP/1.1\r\nHost: example.com:8080\r\nAccept: */*\r\n"
                                        b"Connection: close\r\n\r\n")
    tunnel = _Request.parse(b"CONNECT [2001:db8::1]:443 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (tunnel.method, tunnel.host, tunnel.port) == ("CONNECT", "2001:db8::1", 443)


@pytest.mark.parametrize("head", [
    b"GET /x HTTP/1.1\r\n\r\n", b"GET https://a.example/ HTTP/1.1\r\n\r\n", b"CONNECT a.example HTTP/1.1\r\n\r\n",
    b"CONNECT a.example:0 HTTP/1.1\r\n\r\n", b"GET http://a.example/ HTTP/1.1\r\nBad Header: x\r\n\r\n",
    b"GET http://a.example/ HTTP/1.1\r\n folded: x\r\n\r\n", b"GET http://a.example:99999/ HTTP/1.1\r\n\r\n",
    b"GET http://a.example/ HTTP/2\r\n\r\n", b"GET  http://a.example/ HTTP/1.1\r\n\r\n", b"GET http://a b/ HTTP/1.1\r\n\r\n",
])
def test_a_malformed_request_is_refused_with_400(head: bytes) -> None:
    with pytest.raises(ProxyRefusal) as refused:
        _Request.parse(head)
    assert refused.value.status == 400
