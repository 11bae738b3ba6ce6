"""What the facade raises to the API: each maps to one HTTP status."""

from __future__ import annotations

from sglang_supervisor.operations import Operation


class Busy(RuntimeError):
    """Another operation is running, or the daemon is shutting down (HTTP 409)."""

    def __init__(self, op: Operation, why: str | None = None) -> None:
        super().__init__(
            why
            or f"operation {op.id} ({op.kind}) is running; wait for it (GET /operations/{op.id})"
        )
        self.operation = op


class NoSuchOperation(LookupError):
    """No operation with that id is kept (HTTP 404)."""


class OperationFinished(RuntimeError):
    """The operation has already ended: there is nothing to cancel (HTTP 409)."""

    def __init__(self, op: Operation) -> None:
        super().__init__(f"operation {op.id} ({op.kind}) already ended {op.state}")
        self.operation = op


class NotCancellable(RuntimeError):
    """The operation is past the point a cancel could help: a rollback or containment
    is putting the last-good levers back (HTTP 409); the message says so."""

    def __init__(self, op: Operation, why: str) -> None:
        super().__init__(
            f"operation {op.id} ({op.kind}) cannot be cancelled now: {why}; it ends on its "
            f"own (GET /operations/{op.id})"
        )
        self.operation = op
