"""One ticker watching the serving server: its exit, its liveness, its telemetry (and,
once a minute, the size of its SGLang cache directory).

Every ``tick_s`` the ticker checks whether the launcher exited (a crash is noticed within
one tick); when due it starts a liveness probe or a telemetry read as a short task and
looks at the result on a later tick, so a probe that takes its whole timeout never delays
noticing a crash. Nothing here runs while an operation does: operations watch their own
server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from sglang_supervisor.engine import effect
from sglang_supervisor.engine.boundaries import exit_reason
from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.record import ReadRecord, ServerRecord
from sglang_supervisor.engine.registry import OperationRegistry
from sglang_supervisor.engine.server import serving_cache_dir
from sglang_supervisor.host.backend import ServerHandle
from sglang_supervisor.observe import cachedir, serverlogs
from sglang_supervisor.observe.health import Probe
from sglang_supervisor.observe.telemetry import Throughput, last_decode_line, parse_metrics
from sglang_supervisor.states import ServerState
from sglang_supervisor.units import MiB

log = logging.getLogger("supervisor")
S = ServerState

#: How often the server's throughput is read (its /metrics, else its log).
TELEMETRY_INTERVAL_S = 2.0


class Watcher:
    """Exit, liveness and telemetry of the serving server, on one ticker task."""

    def __init__(
        self,
        parts: Parts,
        record: ServerRecord,
        ops: OperationRegistry,
        on_crash: Callable[[str, str], None],
    ) -> None:
        self.parts, self.record, self.ops = parts, record, ops
        #: Told of a crash ("crash") or a hang ("hung") of the ready server, with why.
        self.on_crash = on_crash
        #: A crash is noticed within 0.25 s by default; cheaper than polling at poll_s.
        self.tick_s = parts.poll_s * 2.5
        self.liveness_failures = 0
        #: The server ``liveness_failures`` counts for: a new one starts from 0.
        #: The launch (its handle: the same across ``server_ready``) failures count for.
        self._failing: ServerHandle | None = None
        self._liveness: asyncio.Task[Probe] | None = None
        #: The server the probe in flight asks (a result about another one is dropped).
        self._probed: object | None = None
        self._telemetry: asyncio.Task[None] | None = None
        self._cache: asyncio.Task[None] | None = None
        #: The ready launch the cache was last measured for (a new one compiles).
        self._measured_for: object | None = None
        self._next_liveness = 0.0
        self._next_telemetry = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        now = self.parts.clock()
        self._next_liveness = now + self.parts.settings.timeouts.liveness_interval_s
        self._next_telemetry = now + TELEMETRY_INTERVAL_S
        self._task = asyncio.create_task(self._run(), name="watch")

    async def stop(self) -> None:
        """Stop ticking; probes in flight are cancelled (they only read)."""
        for task in (self._task, self._liveness, self._telemetry, self._cache):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            try:
                await self.tick()
            except Exception:  # a bug; the watch must go on
                log.exception("watch tick failed")

    def _stuck(self, handle: ServerHandle) -> str | None:
        """A launcher that spans nodes sees a stuck node before the leader's probes fail
        (``SlurmProcessOps.stuck``: the nodes' last samples, no wait)."""
        stuck = getattr(self.parts.procs, "stuck", None)
        return None if stuck is None else stuck(handle)

    def _watching(self) -> bool:
        record = self.record
        return self.ops.current is None and record.state == S.READY and record.server is not None

    async def tick(self) -> None:
        """One look at the server: exit now; liveness and telemetry when due."""
        now = self.parts.clock()
        server = self.record.server
        if self._watching() and server is not None and server.handle.poll():
            self.on_crash("crash", await exit_reason(server.handle, "while ready"))
        elif self._watching() and server is not None and (why := self._stuck(server.handle)):
            self.on_crash("hung", f"hung: {why}")
        self._liveness_tick(now)
        if now >= self._next_telemetry and (self._telemetry is None or self._telemetry.done()):
            self._next_telemetry = now + TELEMETRY_INTERVAL_S
            # The last read into the history and the diagnosis (a server not serving: none).
            record = self.record
            load = record.throughput if record.state in (S.READY, S.DRAINING) else Throughput()
            self.parts.history.record(load)
            self.parts.diagnoser.observe(load)
            effect.look(self.parts, self.ops.current)  # an apply's effect being measured
            self._telemetry = asyncio.create_task(self._read_telemetry(), name="telemetry")
        path = serving_cache_dir(self.parts, self.record.levers)
        usage = self.parts.cache_usage
        launch = _launch(self.record) if self.record.state == S.READY else self._measured_for
        if usage.due(path, now, launch) and (self._cache is None or self._cache.done()):
            usage.started(now, launch)
            self._measured_for = launch
            self._cache = asyncio.create_task(self._measure_cache(path), name="cache-size")

    async def _measure_cache(self, path: Path) -> None:
        """The cache directory's size, walked off the event loop."""
        self.parts.cache_usage.measured(await asyncio.to_thread(cachedir.measure, path))

    def _liveness_tick(self, now: float) -> None:
        parts, record = self.parts, self.record
        t = parts.settings.timeouts
        if self._failing is not _launch(record):
            # A new server (or none): failures of an earlier one never count against it.
            self._failing, self.liveness_failures = _launch(record), 0
        probe = self._liveness
        if probe is not None and probe.done():
            self._liveness = None
            result = None if probe.cancelled() or probe.exception() else probe.result()
            if result is not None and self._probed is _launch(record):
                self._judge(result)
        if self._liveness is None and now >= self._next_liveness:
            self._next_liveness = now + t.liveness_interval_s
            if not self._watching():
                self.liveness_failures = 0
                return
            self._probed = _launch(record)
            self._liveness = asyncio.create_task(
                parts.health.generate_ok(parts.url, t.liveness_timeout_s), name="liveness"
            )

    def _judge(self, probe: Probe) -> None:
        t = self.parts.settings.timeouts
        if probe.ok or not self._watching():
            self.liveness_failures = 0
            return
        self.liveness_failures += 1
        log.warning(
            "liveness probe %d/%d failed: %s",
            self.liveness_failures,
            t.liveness_failures,
            probe.detail,
        )
        if self.liveness_failures >= t.liveness_failures:
            self.liveness_failures = 0
            # A launcher that spans nodes names the node that holds the group up.
            diagnose = getattr(self.parts.procs, "node_diagnosis", None)
            server = self.record.server
            nodes = None if diagnose is None or server is None else diagnose(server.handle)
            self.on_crash(
                "hung",
                f"hung: {t.liveness_failures} consecutive liveness probes failed "
                f"(last: {probe.detail})" + (f"; {nodes}" if nodes else ""),
            )

    async def _read_telemetry(self) -> None:
        parts, record = self.parts, self.record
        server = record.server
        launch = _launch(record)
        if server is None:
            record.throughput_read(Throughput())  # no server, no load: never show a stale one
            return
        await asyncio.to_thread(
            serverlogs.bound_size, server.handle.log_path, parts.settings.server.log_max_mib * MiB
        )
        if record.state not in (S.READY, S.DRAINING) or _launch(record) is not launch:
            return
        read_at = time.time()
        text = await parts.health.metrics_text(parts.url, 2.0)
        if _launch(record) is not launch:
            return  # stopped or replaced meanwhile: these figures are not the server's now
        if text is not None:
            with contextlib.suppress(ValueError):
                load = parse_metrics(text)
                load.read_at = read_at
                record.throughput_read(load)
                return
        fallback = await asyncio.to_thread(last_decode_line, server.handle.log_path)
        if fallback is not None and _launch(record) is launch:
            fallback.read_at = read_at
            record.throughput_read(fallback)


def _launch(record: ReadRecord) -> ServerHandle | None:
    """Which launch the record holds: its handle (a ``ServerInfo`` is replaced when the
    server becomes ready, its launch is not)."""
    return None if record.server is None else record.server.handle
