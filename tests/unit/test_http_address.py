"""The ``http`` setting's address: a bare port is loopback, another address only when named, and
never every interface at once (the Host check could not tell this server's name)."""

from __future__ import annotations

import pytest

from atomictoolsd.transports.http import AddressError, parse_address


@pytest.mark.parametrize(("value", "expected"), [
    ("8765", ("127.0.0.1", 8765)),
    ("0", ("127.0.0.1", 0)),
    ("127.0.0.1:8765", ("127.0.0.1", 8765)),
    ("192.168.1.5:8765", ("192.168.1.5", 8765)),
    ("[::1]:8765", ("::1", 8765)),
    ("localhost:9", ("localhost", 9)),
])
def test_a_bare_port_is_loopback_and_an_address_is_taken_as_named(value: str, expected: tuple[str, int]) -> None:
    assert parse_address(value) == expected


@pytest.mark.parametrize("value", [
    "0.0.0.0:8765", "[::]:8765", "*:8765",
    # the same, spelled as the resolver also takes it
    "0:8765", "0.0.0.00:8765", "0.0:8765", "[::0]:8765", "[0:0:0:0:0:0:0:0]:8765", "[::ffff:0.0.0.0]:1",
])
def test_every_interface_is_refused_saying_to_name_one_address(value: str) -> None:
    with pytest.raises(AddressError, match="name one address"):
        parse_address(value)


@pytest.mark.parametrize("value", ["nonsense:port", "70000", "[::1]8765", ":8765"])
def test_malformed_addresses_say_what_to_write(value: str) -> None:
    with pytest.raises(AddressError, match="http address"):
        parse_address(value)
