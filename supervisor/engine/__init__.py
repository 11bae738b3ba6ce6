"""The engine: the ``Supervisor`` facade and the operations it runs, one at a time.

Holds the transactions (apply, stop, start, restart, recover, shut down), the server in
hand (one launch, its probation, its stop), start-up and adoption, the one ticker, the
journal (the only writer of ``state.json``) and the frozen view readers take.
Steps take what they touch: ``Parts`` (fixed collaborators), the ``ServerRecord`` (the
server's changing facts, written only by its own methods; ``ReadRecord`` to read) and the
``StopRequest``; only ``supervisor.py`` knows the ``Supervisor``.
May import: the shared vocabulary (top level), ``sglang``, ``host``, ``observe``,
``planner``. Never ``sim`` (it comes in through ``host.backend``'s interfaces, assembled by
``runtime``) nor the API. See docs/architecture.md for each module.
"""

from sglang_supervisor.engine.errors import Busy, NoSuchOperation, NotCancellable, OperationFinished
from sglang_supervisor.engine.plan_inputs import PlanInputs
from sglang_supervisor.engine.supervisor import Supervisor
from sglang_supervisor.engine.view import ServerView, SupervisorView

__all__ = [
    "Busy",
    "NoSuchOperation",
    "NotCancellable",
    "OperationFinished",
    "PlanInputs",
    "ServerView",
    "Supervisor",
    "SupervisorView",
]
