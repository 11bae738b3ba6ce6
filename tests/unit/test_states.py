"""The server's state machine: the properties the table must keep, and the edges it must
never allow.

That each allowed edge is one the engine really takes (and that it takes no other) is
tested by driving the engine: ``tests/unit/engine/test_edges.py``.
"""

from __future__ import annotations

from collections import deque

import pytest

from sglang_supervisor.states import (
    ALLOWED,
    IDLE_STATES,
    PROCESS_STATES,
    UNKNOWN_STATES,
    ServerState,
    TransitionError,
    check_transition,
)

S = ServerState


def edge_id(edge: tuple[ServerState, ServerState]) -> str:
    return f"{edge[0]}_to_{edge[1]}"


def test_every_state_has_an_entry() -> None:
    assert set(ALLOWED) == set(ServerState)


FORBIDDEN = [
    # A server is never "ready" without having been started and probed.
    (S.STOPPED, S.READY),
    # Processes may still hold the GPUs: stopped only through releasing.
    (S.STOPPING, S.STOPPED),
    (S.READY, S.STOPPED),
    # A crash is recovered through stop + release first, never by starting over the old tree.
    (S.READY, S.STARTING),
    (S.READY, S.BACKOFF),
    # No edge loops on itself.
    (S.READY, S.READY),
    (S.FAILED, S.FAILED),
    # A failed server is not declared stopped without a teardown and a release.
    (S.FAILED, S.STOPPED),
    (S.BACKOFF, S.READY),
    (S.RELEASING, S.STARTING),
    # Nothing starts from failed before what is left was torn down and released.
    (S.FAILED, S.STARTING),
    # Loading is where a daemon begins, never a state to go back to...
    (S.STOPPED, S.LOADING),
    (S.READY, S.LOADING),
    # ...nor is a server called ready (or failed) before start-up looked at it.
    (S.LOADING, S.READY),
    (S.LOADING, S.FAILED),
]


@pytest.mark.parametrize("edge", FORBIDDEN, ids=edge_id)
def test_transition_forbidden_raises(edge: tuple[ServerState, ServerState]) -> None:
    old, new = edge
    with pytest.raises(TransitionError) as info:
        check_transition(old, new, "a buggy caller")
    assert info.value.old == old
    assert info.value.new == new
    # The message says which edge and why it was attempted.
    assert f"{old} -> {new}" in str(info.value)
    assert "a buggy caller" in str(info.value)


def test_process_idle_and_unknown_states_partition_the_states() -> None:
    assert PROCESS_STATES.isdisjoint(IDLE_STATES)
    assert UNKNOWN_STATES.isdisjoint(PROCESS_STATES | IDLE_STATES)
    assert set(ServerState) == PROCESS_STATES | IDLE_STATES | UNKNOWN_STATES


def _reachable(start: ServerState) -> set[ServerState]:
    seen = {start}
    todo = deque([start])
    while todo:
        for nxt in ALLOWED[todo.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_every_state_reachable_from_loading_and_all_but_loading_from_stopped() -> None:
    assert _reachable(S.LOADING) == set(ServerState)
    assert _reachable(S.STOPPED) == set(ServerState) - {S.LOADING}
    assert not any(S.LOADING in targets for targets in ALLOWED.values())


@pytest.mark.parametrize("state", list(ServerState), ids=str)
def test_every_state_has_a_way_back_to_stopped_or_failed(state: ServerState) -> None:
    assert _reachable(state) & {S.STOPPED, S.FAILED}


def test_releasing_is_the_only_way_into_stopped() -> None:
    """Whatever ran, GPUs are verified released before the server counts as stopped; but
    start-up, which found nothing of ours running (its member scan came back empty) and
    starts nothing, says stopped at once (loading -> stopped)."""
    into_stopped = {old for old, targets in ALLOWED.items() if S.STOPPED in targets}
    assert into_stopped == {S.RELEASING, S.LOADING}


def test_process_states_leave_only_through_stopping_or_releasing() -> None:
    """From a state with live processes, an idle state is reached only through teardown."""
    for old in PROCESS_STATES - {S.RELEASING}:
        assert not (ALLOWED[old] & IDLE_STATES), old
