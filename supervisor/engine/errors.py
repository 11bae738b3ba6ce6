"""What the facade raises to the API: each maps to one HTTP status."""

from __future__ import annotations

from supervisor.operations import Operation


class Busy(RuntimeError):
    """Another operation is running, or the daemon is shutting down (HTTP 409)."""

    def __init__(self, op: Operation) -> None:
        super().__init__(
            f"operation {op.id} ({op.kind}) is running; wait for it (GET /operations/{op.id})"
        )
        self.operation = op


class NoSuchOperation(LookupError):
    """No operation with that id is kept (HTTP 404)."""


class OperationFinished(RuntimeError):
    """The operation has already ended: there is nothing to cancel (HTTP 409)."""

    def __init__(self, op: Operation) -> None:
        super().__init__(f"operation {op.id} ({op.kind}) already ended {op.state}")
        self.operation = op
