"""Which Host headers name the daemon (sglang_supervisor_api.request_guard.HostPolicy; issue 19
§7)."""

from __future__ import annotations

import pytest

from sglang_supervisor_api.request_guard import HostPolicy

POLICY = HostPolicy("127.0.0.1", ["proxy.internal", "gw:443"])


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1:8470", True),
        ("localhost", True),
        ("LOCALHOST.:8470", True),
        ("[::1]:8470", True),
        ("127.0.0.2:8470", True),  # any loopback address: no page can own an IP literal
        ("proxy.internal:9", True),  # configured without a port: any port
        ("gw:443", True),
        ("gw:80", False),  # configured with a port: only that one
        ("127.0.0.1:1", False),  # loopback, but another port than the daemon's
        ("evil.example", False),  # DNS rebinding
        ("evil.example:8470", False),
        ("localhost.evil.example", False),
        ("", False),
        ("a@127.0.0.1", False),
        ("127.0.0.1/x", False),
        ("0x7f.1", False),
    ],
)
def test_host_names_this_daemon(host: str, allowed: bool) -> None:
    assert POLICY.allows(host, 8470) is allowed


def test_star_turns_the_check_off() -> None:
    assert HostPolicy("127.0.0.1", ["*"]).allows("evil.example", 8470)


def test_a_wildcard_bind_answers_to_this_hosts_addresses() -> None:
    policy = HostPolicy("0.0.0.0")
    assert policy.allows("127.0.0.1:8470", 8470)
    assert not policy.allows("evil.example", 8470)
