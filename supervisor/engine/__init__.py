"""The engine: the Supervisor facade and the operations it runs (see docs/architecture.md)."""

from supervisor.engine.errors import Busy, NoSuchOperation, NotCancellable, OperationFinished
from supervisor.engine.supervisor import Supervisor
from supervisor.engine.view import ServerView, SupervisorView

__all__ = [
    "Busy",
    "NoSuchOperation",
    "NotCancellable",
    "OperationFinished",
    "ServerView",
    "Supervisor",
    "SupervisorView",
]
