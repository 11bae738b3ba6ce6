"""What never changes after the ``Supervisor`` is built (``Parts``), and what start-up
learns exactly once (``Learned``: SGLang's flag schema and whether its own parser is live).

The steps take ``Parts`` for the settings, the launcher, the GPU probe, the process
operations, the health checker, the journal, the router client, the event bus and the
clock. Nothing here is reassigned: ``Parts`` is frozen, and ``Learned`` refuses a second
``learn``. (The collaborators themselves have their own state, kept behind their own
methods: the journal's file, the router's registration, the events' ring, the load's
history and its diagnosis, the config's levers as the desired state, the effect being
measured.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sglang_supervisor.config import Settings
from sglang_supervisor.engine.desired import DesiredLevers
from sglang_supervisor.engine.journal import Journal
from sglang_supervisor.host.backend import Backend, ProcessOps
from sglang_supervisor.host.gpu import GpuProbe
from sglang_supervisor.observe.cachedir import CacheDirUsage
from sglang_supervisor.observe.effect import EffectMeter
from sglang_supervisor.observe.events import EventBus
from sglang_supervisor.observe.health import HealthChecker
from sglang_supervisor.observe.history import LoadHistory
from sglang_supervisor.planner.diagnosis import Diagnoser
from sglang_supervisor.sglang.control import ServerControl
from sglang_supervisor.sglang.parser import LoadedSchema
from sglang_supervisor.sglang.router import WorkerLink
from sglang_supervisor.sglang.schema import FlagSchema
from sglang_supervisor.store import Store

#: Reads the live schema of the SGLang in ``server.python`` (its cache in the directory).
SchemaLoader = Callable[[str, Path], LoadedSchema]


@dataclass(frozen=True)
class SchemaFacts:
    """SGLang's flag schema and whether SGLang's own parser validates levers too."""

    schema: FlagSchema
    #: Whether SGLang's own parser (in settings.server.python) validates levers too.
    live: bool = False
    #: Why SGLang's own parser is not used (None when it is).
    warning: str | None = None


class Learned:
    """The schema facts: the bundled schema until start-up learns the live one, once.

    Set once (``learn``; a second call raises ``RuntimeError``) and read-only after: a
    schema that changed under a running daemon would make earlier validations lie."""

    def __init__(self, schema: FlagSchema) -> None:
        self._facts = SchemaFacts(schema)
        self._learned = False

    @property
    def facts(self) -> SchemaFacts:
        return self._facts

    def learn(self, facts: SchemaFacts) -> None:
        """Start-up's one reading of server.python's SGLang."""
        if self._learned:
            raise RuntimeError("the flag schema is learned once, at start-up")
        self._facts, self._learned = facts, True


@dataclass(frozen=True)
class Parts:
    """The supervisor's collaborators: fixed at construction, shared by every step."""

    settings: Settings
    #: The launcher (its command, environment and GPU probe).
    backend: Backend
    procs: ProcessOps
    health: HealthChecker
    #: The only writer of ``state.json``.
    journal: Journal
    #: The sglang-router in front of the server (``NoRouter`` without [router] url).
    router: WorkerLink
    events: EventBus
    clock: Callable[[], float]
    #: How often waits poll (tests run it fast).
    poll_s: float
    #: The launch tag every process of this instance carries (``config.instance_tag_prefix``).
    tag_prefix: str
    #: The flag schema: the bundled one, then what start-up learned (``Learned``).
    learned: Learned
    #: The server's load over the last hour, and its diagnosis (written by the watcher).
    history: LoadHistory
    diagnoser: Diagnoser
    #: The config file's levers as the desired state (re-read on SIGHUP; engine/desired.py).
    desired: DesiredLevers
    #: An apply's effect being measured, the last one judged (observe/effect.py).
    effects: EffectMeter
    #: Reads the live schema at start-up (None: keep the bundled one).
    schema_loader: SchemaLoader | None = None
    #: SGLang's runtime endpoints: what changes the running server without a restart.
    control: ServerControl = field(default_factory=ServerControl)
    #: The server's SGLANG_CACHE_DIR and its size, as last measured (for /status).
    cache_usage: CacheDirUsage = field(default_factory=CacheDirUsage)

    @property
    def probe(self) -> GpuProbe:
        return self.backend.probe

    @property
    def schema(self) -> FlagSchema:
        return self.learned.facts.schema

    @property
    def schema_live(self) -> bool:
        return self.learned.facts.live

    @property
    def schema_warning(self) -> str | None:
        return self.learned.facts.warning

    @property
    def store(self) -> Store:
        return self.journal.store

    @property
    def url(self) -> str:
        """The server's base URL (an IPv6 host in brackets)."""
        s = self.settings.server
        host = f"[{s.host}]" if ":" in s.host else s.host
        return f"http://{host}:{s.port}"
