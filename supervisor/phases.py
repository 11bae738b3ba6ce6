"""The names of operations and of their phases: one vocabulary for the engine, the
metrics, the CLI and the tests.

``StrEnum`` members are ``str``: JSON, log lines and Prometheus labels carry the same
plain strings as before (``"apply"``, ``"rollback_start"``). This module imports nothing
of the project.
"""

from __future__ import annotations

import enum


class OpKind(enum.StrEnum):
    """What an operation does."""

    APPLY = "apply"
    STOP = "stop"
    START = "start"
    RESTART = "restart"
    #: The supervisor's own restart of a server that crashed or hung.
    RECOVER = "recover"
    SHUTDOWN = "shutdown"


#: Operations an operator asks for whose success resets the crash-loop count.
OPERATOR_LAUNCHES = frozenset({OpKind.APPLY, OpKind.START, OpKind.RESTART})


class PhaseName(enum.StrEnum):
    """One step of an operation, as it appears in ``operation.phases[].name``."""

    VALIDATE = "validate"
    PREFLIGHT = "preflight"
    DRAIN = "drain"
    STOP = "stop"
    RELEASE = "release"
    START = "start"
    PROBATION = "probation"
    COMMIT = "commit"
    BACKOFF = "backoff"
    #: Start-up: a server an earlier daemon left running was taken over.
    ADOPT = "adopt"
    #: Start-up: the last daemon exited in the middle of an apply.
    INTERRUPTED_APPLY = "interrupted_apply"
    #: A process that is not ours holds a managed GPU: nothing is started.
    FOREIGN_PROCESSES = "foreign_processes"
    #: With [router]: the server taken out of the router before its stop...
    ROUTER_REMOVE = "router_remove"
    #: ...and the new one added, listed healthy by the router, before the commit.
    ROUTER_ADD = "router_add"
    #: Before the stop: the new set's weight files read into the page cache.
    WARMUP = "warmup"
    #: Levers SGLang changes on the running server, changed there...
    LIVE = "live"
    #: ...new weights loaded into the running server (/update_weights_from_disk)...
    WEIGHTS = "weights"
    #: ...and read back from it before the commit.
    VERIFY = "verify"
    #: An operator's cancel that came after the operation's last step that could end
    #: it: not honoured, and said so rather than dropped.
    CANCEL = "cancel"
    #: With the effect guard: the new server serves for the effect window, then its
    #: measured effect is judged (worse: the apply rolls back), before the commit.
    EFFECT = "effect"


class PhasePrefix(enum.StrEnum):
    """A phase run again for another purpose: ``rollback_start``, ``cleanup_stop``."""

    ROLLBACK = "rollback_"
    CLEANUP = "cleanup_"
    #: Start-up: processes of this instance an earlier daemon left behind.
    LEFTOVERS = "leftovers_"


#: Phases whose durations the metrics record (a prefixed phase counts under its base).
TIMED_PHASES: tuple[PhaseName, ...] = (
    PhaseName.VALIDATE,
    PhaseName.PREFLIGHT,
    PhaseName.DRAIN,
    PhaseName.STOP,
    PhaseName.RELEASE,
    PhaseName.START,
    PhaseName.PROBATION,
    PhaseName.COMMIT,
    PhaseName.BACKOFF,
    PhaseName.ROUTER_REMOVE,
    PhaseName.ROUTER_ADD,
    PhaseName.WARMUP,
    PhaseName.LIVE,
    PhaseName.WEIGHTS,
    PhaseName.VERIFY,
    PhaseName.EFFECT,
)


def prefixed(prefix: PhasePrefix | str, name: PhaseName) -> str:
    """``prefixed(PhasePrefix.ROLLBACK, PhaseName.START)`` -> ``"rollback_start"``."""
    return f"{prefix}{name}"


def base_phase(name: str) -> PhaseName | None:
    """The phase a (possibly prefixed) name is an instance of; None for an unknown one."""
    for prefix in PhasePrefix:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    try:
        return PhaseName(name)
    except ValueError:
        return None


class OpState(enum.StrEnum):
    """Where an operation is: running, then one of the three outcomes."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    #: The new levers failed; the last-good ones serve again.
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"


OUTCOMES: tuple[OpState, ...] = (OpState.SUCCEEDED, OpState.ROLLED_BACK, OpState.FAILED)
