"""The engine: the Supervisor facade and the operations it runs (see docs/architecture.md)."""

from supervisor.engine.errors import Busy, NoSuchOperation, OperationFinished
from supervisor.engine.supervisor import Supervisor
from supervisor.engine.view import ServerView, SupervisorView

__all__ = [
    "Busy",
    "NoSuchOperation",
    "OperationFinished",
    "ServerView",
    "Supervisor",
    "SupervisorView",
]
