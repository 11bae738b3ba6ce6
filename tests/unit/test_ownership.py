"""The host-wide instance lock and the server port's owner, on this machine's real sockets
(loopback and the abstract Unix namespace only)."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

from sglang_supervisor.host.ports import collides, describe_pid, port_listeners
from sglang_supervisor_api.instance_lock import (
    InstanceBusy,
    hold_instance,
    owner_pid,
    owners,
    socket_name,
)
from tests.helpers import squatter


def test_an_instance_is_held_once_and_names_its_owner() -> None:
    instance = f"sgs-unit-{uuid.uuid4().hex[:8]}"
    assert owner_pid(instance) is None
    held = hold_instance(instance)
    try:
        assert owner_pid(instance) == os.getpid()
        with pytest.raises(InstanceBusy) as caught:
            hold_instance(instance)
        assert caught.value.pid == os.getpid()
        assert f"daemon pid {os.getpid()}" in str(caught.value)
        assert repr(instance) in str(caught.value)
    finally:
        held.close()
    # The kernel drops the name with the socket: the next daemon takes it at once.
    hold_instance(instance).close()


@pytest.mark.parametrize("how", ["listen", "bind"])
def test_a_holder_of_another_uid_is_not_an_owner(how: str) -> None:
    """Issue 27 §3: uid 65534 bound the instance's name first, and the daemon (root) exited
    2 "already owned by daemon pid N", cleanup refused, and RestartPreventExitStatus=2 kept
    the service down. Only a holder of the daemon's own uid owns the instance; the daemon
    holds it under another name, and one-daemon-per-instance still holds."""
    instance = f"sgs-unit-{uuid.uuid4().hex[:8]}"
    with squatter(socket_name(instance), how):
        assert owner_pid(instance) is None  # cleanup is not refused for a squatter
        first = hold_instance(instance)
    try:
        # (The squatter is gone from here on.)
        assert first.getsockname() != socket_name(instance)
        assert owner_pid(instance) == os.getpid()
        assert [h.name for h in owners(instance)] == [first.getsockname()]
        # A second daemon, taking the instance's own name now, finds the first one.
        with pytest.raises(InstanceBusy) as caught:
            hold_instance(instance)
        assert caught.value.pid == os.getpid()
    finally:
        first.close()
    hold_instance(instance).close()


def test_a_second_daemon_finds_the_first_beside_a_squatter() -> None:
    instance = f"sgs-unit-{uuid.uuid4().hex[:8]}"
    with squatter(socket_name(instance)):
        first = hold_instance(instance)
        try:
            with pytest.raises(InstanceBusy) as caught:
                hold_instance(instance)
            assert caught.value.pid == os.getpid()
        finally:
            first.close()
        hold_instance(instance).close()  # the first gone: the next daemon gets in


def test_a_long_instance_name_fits_the_abstract_namespace() -> None:
    long = "x" * 300
    name = socket_name(long)
    assert name.startswith(b"\0") and len(name) <= 107
    assert socket_name(long + "y") != name  # still one name per instance
    hold_instance(long).close()


def test_the_listener_on_the_port_is_named_by_pid() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port_listeners("127.0.0.1", port) == [os.getpid()]
        assert port_listeners("0.0.0.0", port) == [os.getpid()]
        assert f"pid {os.getpid()} (" in describe_pid(os.getpid(), port)
    assert port_listeners("127.0.0.1", port) == []


def test_an_owner_this_daemon_cannot_see_is_described_with_what_to_do() -> None:
    text = describe_pid(None, 30000)
    assert "cannot see" in text and "ss -ltnp 'sport = :30000'" in text


@pytest.mark.parametrize(
    ("listen_ip", "host", "expected"),
    [
        ("0.0.0.0", "127.0.0.1", True),
        ("127.0.0.1", "0.0.0.0", True),
        ("127.0.0.1", "127.0.0.1", True),
        ("127.0.0.2", "127.0.0.1", False),
        ("::", "127.0.0.1", True),
        ("127.0.0.2", "localhost", True),  # a name may resolve to anything
    ],
)
def test_which_listeners_keep_the_server_host_from_binding(
    listen_ip: str, host: str, expected: bool
) -> None:
    assert collides(listen_ip, host) is expected
