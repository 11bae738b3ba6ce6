"""The server's state machine: exactly the documented edges, nothing else.

One test per allowed edge (the reason string says when the Supervisor takes it), a few
edges that must stay forbidden, and properties of the graph as a whole.
"""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.states import (
    ALLOWED,
    IDLE_STATES,
    PROCESS_STATES,
    ServerState,
    TransitionError,
    check_transition,
)

S = ServerState

#: Every allowed edge and the situation in which the Supervisor takes it.
EDGES: dict[tuple[ServerState, ServerState], str] = {
    (S.STOPPED, S.STARTING): "launch the levers",
    (S.STOPPED, S.STOPPING): "leftover processes of this instance found at start-up",
    (S.STARTING, S.READY): "/health_generate answered 200",
    (S.STARTING, S.STOPPING): "start failed: exit, OOM, readiness timeout, or cancelled",
    (S.READY, S.DRAINING): "apply with a drain timeout",
    (S.READY, S.STOPPING): "apply, stop, restart, crash or hang of a ready server",
    (S.DRAINING, S.STOPPING): "drain finished or timed out",
    (S.DRAINING, S.READY): "an operator cancelled the apply during its drain",
    (S.STOPPING, S.RELEASING): "every member exited (or teardown gave up)",
    (S.RELEASING, S.STOPPED): "every managed GPU verified released",
    (S.RELEASING, S.BACKOFF): "released after a crash; wait before restarting",
    (S.RELEASING, S.FAILED): "GPUs not released by the deadline",
    (S.BACKOFF, S.STARTING): "backoff elapsed; restart with the same levers",
    (S.BACKOFF, S.STOPPING): "an operator's stop/apply preempts the backoff",
    (S.BACKOFF, S.FAILED): "crash loop",
    (S.FAILED, S.STOPPING): "an operator's stop/start/apply tears down what is left",
    (S.FAILED, S.STARTING): "an operator's start after a crash loop",
}


def edge_id(edge: tuple[ServerState, ServerState]) -> str:
    return f"{edge[0]}_to_{edge[1]}"


@pytest.mark.parametrize("edge", list(EDGES), ids=edge_id)
def test_transition_allowed(edge: tuple[ServerState, ServerState]) -> None:
    old, new = edge
    check_transition(old, new, EDGES[edge])  # does not raise


def test_allowed_edges_are_exactly_the_documented_ones() -> None:
    """A new edge needs a line in EDGES above (and a test of its behaviour in tests/unit/engine)."""
    actual = {(old, new) for old, targets in ALLOWED.items() for new in targets}
    assert actual == set(EDGES)


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


def test_process_and_idle_states_partition_the_states() -> None:
    assert PROCESS_STATES.isdisjoint(IDLE_STATES)
    assert set(ServerState) == PROCESS_STATES | IDLE_STATES


def _reachable(start: ServerState) -> set[ServerState]:
    seen = {start}
    todo = deque([start])
    while todo:
        for nxt in ALLOWED[todo.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_every_state_reachable_from_stopped() -> None:
    assert _reachable(S.STOPPED) == set(ServerState)


@pytest.mark.parametrize("state", list(ServerState), ids=str)
def test_every_state_has_a_way_back_to_stopped_or_failed(state: ServerState) -> None:
    assert _reachable(state) & {S.STOPPED, S.FAILED}


def test_releasing_is_the_only_way_into_stopped() -> None:
    """Whatever ran, GPUs are verified released before the server counts as stopped."""
    into_stopped = {old for old, targets in ALLOWED.items() if S.STOPPED in targets}
    assert into_stopped == {S.RELEASING}


def test_process_states_leave_only_through_stopping_or_releasing() -> None:
    """From a state with live processes, an idle state is reached only through teardown."""
    for old in PROCESS_STATES - {S.RELEASING}:
        assert not (ALLOWED[old] & IDLE_STATES), old


@given(st.lists(st.integers(min_value=0, max_value=1000), max_size=60))
def test_random_walks_of_allowed_edges_never_raise(choices: list[int]) -> None:
    state = S.STOPPED
    for pick in choices:
        targets = sorted(ALLOWED[state])
        new = targets[pick % len(targets)]
        check_transition(state, new, "random walk")
        state = new


@given(st.sampled_from(list(ServerState)), st.sampled_from(list(ServerState)))
def test_check_transition_raises_exactly_off_the_allowed_set(
    old: ServerState, new: ServerState
) -> None:
    if new in ALLOWED[old]:
        check_transition(old, new, "property")
    else:
        with pytest.raises(TransitionError):
            check_transition(old, new, "property")
