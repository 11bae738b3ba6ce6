"""The daemon's one long-lived presence on every node of the allocation: ONE
``srun --overlap`` step, one task per node (``sglang_supervisor.slurm.agent``), started
once and restarted (with back-off) if it dies. Slurm launches, tracks and signals it.

Questions to the nodes (GPUs, our processes, the leader's signal, a sweep, a port's
holders) go to its tasks over srun's stdin and come back on its labelled stdout, so reads
and scrapes create no job step, and an apply creates only the server's own (Slurm's
``MaxStepCount`` is per job: a step per question used it up in days). Between questions
every task samples its node every ``slurm.sample_interval_s``: ``/status`` and
``/metrics`` answer from the last sample, with its age, and never wait on a node.

When Slurm refuses the presence's step (the step limit, a dead controller), the refusal is
counted and kept (``/status`` ``slurm``, ``sglang_supervisor_slurm_step_refusals_total``);
questions then fail naming it, and the next launch waits out a back-off (1 s doubling to
60 s), so a refusing Slurm is not asked again and again.
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any

from sglang_supervisor.host.gpu import GpuQueryError
from sglang_supervisor.host.process import TAG_ENV
from sglang_supervisor.slurm.settings import SlurmSettings
from sglang_supervisor.slurm.step import srun_said

log = logging.getLogger("supervisor")

#: The presence step's name (``squeue -s``).
PRESENCE_NAME = "sglang-supervisor-presence"
_LABELLED = re.compile(r"^\s*(\d+): (.*)$")
#: A message start: every line an agent prints begins with one of these keys.
_STARTS = ('{"sample":', '{"id":')
#: A message longer than this is dropped (bounded memory, whatever a task prints).
MAX_MESSAGE_CHARS = 4 * 2**20
BACKOFF_MIN_S, BACKOFF_MAX_S = 1.0, 60.0
#: Up this long before it died: the next launch needs no back-off.
STABLE_S = 60.0
#: How long a presence just launched may take to sample every node (Slurm makes its step,
#: every node starts an interpreter): questions wait for that, then ``probe_timeout_s``.
START_S = 60.0


@dataclass(frozen=True)
class NodeSample:
    """One node's last sample (``agent.sample``) and when it came (monotonic)."""

    node: str
    data: dict[str, Any]
    at: float


class Presence:
    """The presence step (module docstring). Thread-safe; every method but ``latest``
    and ``status_json`` may block (call them from worker threads)."""

    def __init__(
        self,
        slurm: SlurmSettings,
        job_id: str,
        nodes: tuple[str, ...],
        agent_args: Sequence[str] = (),
        *,
        tag_prefix: str,
        python: str = sys.executable,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.slurm, self.job_id, self.nodes = slurm, job_id, nodes
        self.agent_args, self.tag_prefix, self.python = tuple(agent_args), tag_prefix, python
        self.clock = clock
        self._cond = threading.Condition()
        self._launch_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self._started_at = 0.0
        self._step: str | None = None
        self._samples: dict[str, NodeSample] = {}
        #: The nodes whose task of the running launch has sampled (it answers questions).
        self._up: set[str] = set()
        #: Request id -> {node: answer}, for the questions being waited for only.
        self._waiting: dict[int, dict[str, Any]] = {}
        self._next_id = 0
        self._stderr: deque[str] = deque(maxlen=40)
        self._backoff = BACKOFF_MIN_S
        self._next_launch = 0.0
        self._closed = False
        #: Why each srun of the presence ended (by pid; the last few).
        self._why_ended: dict[int, str] = {}
        #: Steps this presence created (launches), Slurm's refusals of them, deaths.
        self.launches = 0
        self.refusals = 0
        #: Refusals since the presence last sampled (a step Slurm made and kept).
        self.refused_in_a_row = 0
        self.deaths = 0
        self.last_refusal: str | None = None
        self.last_exit: str | None = None

    # -- the step --

    def argv(self) -> list[str]:
        """The presence's ``srun`` (one task per node of the allocation)."""
        return [
            self.slurm.srun,
            "--overlap",
            f"--jobid={self.job_id}",
            f"--nodes={len(self.nodes)}",
            "--ntasks-per-node=1",
            f"--nodelist={','.join(self.nodes)}",
            "--label",
            # One task gone is the whole presence gone: it is relaunched whole.
            "--kill-on-bad-exit=1",
            f"--job-name={PRESENCE_NAME}",
            *self.slurm.probe_args,
            self.python,
            "-m",
            "sglang_supervisor.slurm.agent",
            "--interval",
            f"{self.slurm.sample_interval_s:g}",
            "--tag-prefix",
            self.tag_prefix,
            *self.agent_args,
        ]

    def _running(self) -> subprocess.Popen[str]:
        """The presence's srun, launched when there is none (and no back-off is due).
        Raises ``GpuQueryError`` saying why there is none."""
        with self._launch_lock:
            proc = self._proc
            if proc is not None and proc.poll() is None:
                return proc
            if self._closed:
                raise GpuQueryError("the per-node presence is closed (the daemon is stopping)")
            wait = self._next_launch - self.clock()
            if wait > 0:
                raise GpuQueryError(
                    f"the per-node presence is down ({self.last_refusal or self.last_exit}); "
                    f"it is relaunched in {wait:.1f}s"
                )
            return self._launch()

    def _launch(self) -> subprocess.Popen[str]:
        # The presence is no member of any launch: never give it our launch tag.
        env = {k: v for k, v in os.environ.items() if k != TAG_ENV}
        try:
            proc = subprocess.Popen(
                self.argv(),
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                bufsize=1,
                # The daemon's terminal signals (a Ctrl-C) are not the presence's.
                start_new_session=True,
            )
        except OSError as exc:
            self._ended(None, f"cannot run {self.slurm.srun!r}: {exc}", refused=True)
            raise GpuQueryError(f"cannot run {self.slurm.srun!r}: {exc}") from exc
        self.launches += 1
        with self._cond:
            self._proc, self._started_at, self._step = proc, self.clock(), None
            # Readers keep the last samples (ageing) until this launch's come.
            self._up.clear()
            self._stderr.clear()
        assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None
        os.set_blocking(proc.stdin.fileno(), False)  # a question never blocks (``_write``)
        threading.Thread(
            target=self._read, args=(proc, proc.stdout), name="presence-out", daemon=True
        ).start()
        threading.Thread(
            target=self._read_stderr, args=(proc.stderr,), name="presence-err", daemon=True
        ).start()
        log.info("per-node presence: %s", " ".join(self.argv()[:9]))
        return proc

    def _read_stderr(self, stream: IO[str]) -> None:
        self._stderr.extend(line.rstrip()[:500] for line in stream)

    def _read(self, proc: subprocess.Popen[str], stream: IO[str]) -> None:
        """The presence's stdout: samples and answers, joined from srun's pieces."""
        pieces: dict[int, str] = {}
        for raw in stream:
            found = _LABELLED.match(raw.rstrip("\n"))
            if found is None:
                continue
            task, text = int(found.group(1)), found.group(2)
            acc = pieces.get(task, "")
            if acc and text.startswith(_STARTS):
                acc = ""  # a new message: the unfinished one was lost
            acc += text
            data: Any = None
            if acc.endswith("}"):
                try:
                    data = json.loads(acc)
                except ValueError:
                    data = None
            if isinstance(data, dict):
                pieces[task] = ""
                self._received(data)
            else:
                pieces[task] = acc if len(acc) <= MAX_MESSAGE_CHARS else ""
        rc = proc.wait()
        with self._cond:
            refused = not self._up and not self._closed  # no task of it ever sampled
        how = f"srun exited with status {rc}"
        tail = list(self._stderr)
        self._ended(proc, f"{how}: {srun_said(tail)}", refused=refused)

    def _received(self, data: dict[str, Any]) -> None:
        node = str(data.get("node", ""))
        with self._cond:
            if "sample" in data:
                self._samples[node] = NodeSample(node, data, self.clock())
                self._up.add(node)
                self.refused_in_a_row = 0
                step = data.get("step")
                if step is not None:
                    self._step = f"{self.job_id}.{step}"
            elif "id" in data:
                got = self._waiting.get(int(data["id"]))
                if got is not None:
                    got[node] = data
            self._cond.notify_all()

    def _ended(self, proc: subprocess.Popen[str] | None, why: str, *, refused: bool) -> None:
        """The presence's srun is gone: count it, and when it may be launched again."""
        with self._cond:
            if proc is not None:
                self._why_ended[proc.pid] = why
                while len(self._why_ended) > 8:
                    self._why_ended.pop(next(iter(self._why_ended)))
            if proc is not None and proc is not self._proc:
                return
            up_for = self.clock() - self._started_at
            if refused:
                self.refusals += 1
                self.refused_in_a_row += 1
                self.last_refusal = why
                log.error("Slurm refused the per-node presence's step: %s", why)
            elif not self._closed:
                self.deaths += 1
                self.last_exit = why
                log.warning("the per-node presence ended after %.0fs: %s", up_for, why)
            if not refused and up_for >= STABLE_S:
                self._backoff = BACKOFF_MIN_S
            self._next_launch = self.clock() + self._backoff
            self._backoff = min(BACKOFF_MAX_S, self._backoff * 2)
            self._cond.notify_all()

    # -- questions --

    def ask(
        self, argv: Sequence[str], nodes: Sequence[str] | None = None, timeout: float | None = None
    ) -> dict[str, Any]:
        """``{node: answer}`` of every node in ``nodes`` (default: all) to the question
        ``argv`` (``nodeprobe``'s options). Blocking, within ``timeout`` (default
        ``slurm.probe_timeout_s``). Raises ``GpuQueryError`` naming the nodes that did
        not answer (or the node whose answer is an error)."""
        use = list(nodes or self.nodes)
        limit = self.slurm.probe_timeout_s if timeout is None else timeout
        proc = self._running()
        with self._cond:
            rid = self._next_id
            self._next_id += 1
            self._waiting[rid] = {}
        try:
            # A presence just launched first has its step made and an interpreter started
            # on every node: that is given START_S, the question itself ``limit``.
            up = self.clock() + max(limit, START_S)
            self._wait_for(lambda: all(n in self._up for n in use), proc, up)
            deadline = self.clock() + limit
            line = json.dumps({"id": rid, "nodes": use, "argv": list(argv)}) + "\n"
            if not self._write(proc, line.encode(), deadline):
                raise GpuQueryError(
                    f"the per-node presence takes no question within {limit:g}s (its stdin "
                    "is full: a node's task does not read; slurm.probe_timeout_s)"
                )
            got = self._waiting[rid]
            self._wait_for(lambda: all(n in got for n in use), proc, deadline)
            answers = {n: got[n] for n in use if n in got}
        finally:
            with self._cond:
                self._waiting.pop(rid, None)
        missing = [n for n in use if n not in answers]
        if missing:
            raise GpuQueryError(self._silence(missing, limit, proc))
        for node, data in answers.items():
            if "error" in data:
                raise GpuQueryError(f"node {node}: {data['error']}")
        return answers

    def _write(self, proc: subprocess.Popen[str], data: bytes, deadline: float) -> bool:
        """``data`` to srun's stdin by ``deadline`` (False: it did not fit; srun stops
        reading when a node's task does), never blocking. True also when srun is gone."""
        with self._write_lock:
            if proc.stdin is None or proc.stdin.closed:
                return True
            fd = proc.stdin.fileno()
            while data:
                try:
                    data = data[os.write(fd, data) :]
                except BlockingIOError:
                    left = deadline - self.clock()
                    if left <= 0:
                        return False
                    select.select([], [fd], [], min(left, 0.5))
                except OSError:
                    return True  # srun is gone: said below, with what it said
        return True

    def _wait_for(
        self, done: Callable[[], bool], proc: subprocess.Popen[str], deadline: float
    ) -> None:
        with self._cond:
            while not done() and self._proc is proc and proc.returncode is None:
                left = deadline - self.clock()
                if left <= 0:
                    return
                self._cond.wait(min(left, 0.5))

    def _silence(self, missing: list[str], limit: float, proc: subprocess.Popen[str]) -> str:
        """Why ``missing`` did not answer: the presence ended, or the node is silent."""
        names = ", ".join(missing)
        if proc.poll() is not None:
            with self._cond:  # the reader records why it ended (srun's words)
                self._cond.wait_for(lambda: proc.pid in self._why_ended, 2.0)
            return (
                f"node(s) {names} did not answer: the per-node presence ended "
                f"({self._why_ended.get(proc.pid, f'srun exited with status {proc.returncode}')})"
            )
        now = self.clock()
        ages = []
        for n in missing:
            s = self._samples.get(n)
            ages.append(
                f"{n}: no sample yet" if s is None else f"{n}: last sample {now - s.at:.1f}s old"
            )
        return (
            f"node(s) {names} did not answer the per-node presence within {limit:g}s "
            f"(slurm.probe_timeout_s; {'; '.join(ages)}): the node, its slurmstepd or the "
            "presence's task there is stuck"
        )

    # -- what readers see without waiting --

    def latest(self) -> dict[str, NodeSample]:
        """Every node's last sample (never waits; empty before the first)."""
        with self._cond:
            return dict(self._samples)

    def status_json(self) -> dict[str, Any]:
        """``/status``'s ``slurm.presence``."""
        now = self.clock()
        with self._cond:
            proc = self._proc
            up = proc is not None and proc.poll() is None
            ages = {n: round(now - s.at, 3) for n, s in self._samples.items()}
            return {
                "step": self._step if up else None,
                "state": "down" if not up else "up" if self._up >= set(self.nodes) else "starting",
                "sample_age_s": ages,
                "launches": self.launches,
                "refusals": self.refusals,
                "refused_in_a_row": self.refused_in_a_row,
                "last_refusal": self.last_refusal,
                "deaths": self.deaths,
                "last_exit": self.last_exit,
            }

    def close(self) -> None:
        """End the presence: its stdin closes, every task sees the end and exits, the
        step ends (killed after 5 s if it has not). Blocking; idempotent."""
        with self._launch_lock:
            self._closed = True
            proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        try:
            with self._write_lock:
                if proc.stdin is not None:
                    proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(5.0)
        except subprocess.TimeoutExpired:
            proc.kill()  # srun's death ends its step (Slurm kills the tasks)
            proc.wait(5.0)
