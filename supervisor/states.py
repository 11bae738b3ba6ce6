"""The server's lifecycle states and the transitions allowed between them.

This module imports nothing of the project: it is the vocabulary every other module
shares. The one function that performs a transition lives in ``engine.Supervisor``; it
checks every move against ``ALLOWED`` below.
"""

from __future__ import annotations

import enum


class ServerState(enum.StrEnum):
    #: The daemon's start-up: it reads its state, SGLang's flag schema and the GPUs, then
    #: looks for what runs on them (a server an earlier daemon left, its leftovers). What
    #: the server is, is not known yet: neither stopped nor running.
    LOADING = "loading"
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"
    RELEASING = "releasing"
    BACKOFF = "backoff"
    FAILED = "failed"


S = ServerState

#: Every allowed edge, ``old -> {new, ...}``.
ALLOWED: dict[ServerState, frozenset[ServerState]] = {
    # loading -> starting: a launch, or the adoption of an earlier daemon's server;
    # loading -> stopping: that daemon's leftovers are torn down first; loading ->
    # stopped: nothing of ours runs, and start-up starts nothing (an operator's stop
    # holds, a foreign process holds a GPU, the GPUs cannot be read).
    S.LOADING: frozenset({S.STARTING, S.STOPPING, S.STOPPED}),
    # stopped -> stopping: a shutdown or a clean-up before a start (nothing may be left).
    S.STOPPED: frozenset({S.STARTING, S.STOPPING}),
    # starting -> stopping: start failed (exit, OOM, readiness timeout) or was cancelled.
    S.STARTING: frozenset({S.READY, S.STOPPING}),
    S.READY: frozenset({S.DRAINING, S.STOPPING}),
    # draining -> ready: an operator cancelled the apply before anything was stopped.
    S.DRAINING: frozenset({S.STOPPING, S.READY}),
    S.STOPPING: frozenset({S.RELEASING}),
    # releasing ends only when every managed GPU is verified released (or it never is: failed).
    S.RELEASING: frozenset({S.STOPPED, S.BACKOFF, S.FAILED}),
    # backoff -> stopping: an operator's stop/apply preempts the wait (and clears up first).
    S.BACKOFF: frozenset({S.STARTING, S.STOPPING, S.FAILED}),
    # failed -> stopping: an operator's stop/start/apply first tears down what is left
    # (and verifies the release) before anything starts.
    S.FAILED: frozenset({S.STOPPING}),
}

#: States in which server processes of ours may be alive.
PROCESS_STATES = frozenset({S.STARTING, S.READY, S.DRAINING, S.STOPPING, S.RELEASING})
#: States in which nothing of ours should be running.
IDLE_STATES = frozenset({S.STOPPED, S.BACKOFF, S.FAILED})
#: States in which the daemon does not know yet whether anything of ours runs.
UNKNOWN_STATES = frozenset({S.LOADING})


class TransitionError(RuntimeError):
    """A transition outside ``ALLOWED`` was attempted: a bug in the caller, never input."""

    def __init__(self, old: ServerState, new: ServerState, reason: str) -> None:
        super().__init__(f"illegal transition {old} -> {new} ({reason})")
        self.old = old
        self.new = new


def check_transition(old: ServerState, new: ServerState, reason: str) -> None:
    """Raise ``TransitionError`` unless ``old -> new`` is an allowed edge."""
    if new not in ALLOWED[old]:
        raise TransitionError(old, new, reason)
