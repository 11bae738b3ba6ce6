"""The simulated server on several nodes (``--nnodes N --node-rank i --dist-init-addr
host:port``), shaped like SGLang 0.5.23 there (docs/design.md "Servers that span several
hosts", docs/slurm.md):

* every node runs its share of the ranks, ``tp × pp / nnodes``, on its own visible GPUs
  (per Slurm node: ``SGLANG_SIM_GPU_DIR_PER_NODE``, ``sglang_supervisor.sim.flags``);
* start-up couples the nodes: node 0 listens on ``--dist-init-addr`` and every node meets
  it there (``SGLANG_SIM_RENDEZVOUS_S``, 60 s, to all arrive); each node says whether its
  GPUs are free of other processes, and when one is not, every node fails with SGLang's
  "The memory capacity is unbalanced" (``distributed/bootstrap.py:441-449``): one dirty
  node fails the group;
* node 0 alone serves HTTP and generates (``GroupLeader``, the ordinary ``Launcher``);
  nodes ≥ 1 (``WorkerNode``) serve nothing here (SGLang's dummy health server is left out:
  every simulated node shares one host's ports), log and ignore SIGTERM, and exit when
  the leader broadcasts its shutdown at the end of its graceful exit;
* every node takes part in every step of the leader's scheduler, as a collective: SGLang's
  scheduler broadcasts its input to every TP rank on each pass of its loop, busy or idle
  (``srt/managers/scheduler_components/request_receiver.py:80-101``, SGLang 0.5.23), and
  each forward is a collective over all ranks. So node 0 waits on every node at each tick
  and before it calls itself ready (its warm-up: every node's ranks are up): a frozen node
  (SIGSTOP, an NCCL hang, a D-state) stalls generation and ``/health_generate``, which
  answers 503 after SGLang's ``SGLANG_HEALTH_CHECK_TIMEOUT`` (20 s,
  ``srt/entrypoints/http_server.py:218``); a SIGTERM then waits behind the stalled
  collective, as SGLang's drain would; a node gone from it fails node 0 (exit 1);
* a node whose rank dies exits 1 (with ``srun --kill-on-bad-exit`` the step ends); a
  collective that waits longer than ``SGLANG_SIM_NODE_WATCHDOG_S`` (30 s) fails node 0 with
  exit 1, and when the leader vanishes without its broadcast the other nodes hang until
  the same watchdog ends them with exit 1, as NCCL's would.

The rendezvous is newline-delimited JSON over one TCP connection per node.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, fields
from types import FrameType
from typing import Any

from sglang_supervisor.planner import ModelSpec
from sglang_supervisor.sglang.layout import Layout
from sglang_supervisor.sim import capacity
from sglang_supervisor.sim.children import Children, ServerFailure
from sglang_supervisor.sim.flags import ServerConfig, SimEnv, log
from sglang_supervisor.sim.gpus import holds_memory, read_registry
from sglang_supervisor.sim.lifecycle import Launcher, Phase

UNBALANCED = "The memory capacity is unbalanced. Some GPUs may be occupied by other processes."


def _seconds(name: str, default: float) -> float:
    try:
        return max(0.0, float(os.environ.get(name, default)))
    except ValueError:
        return default


@dataclass(frozen=True)
class NodeConfig(ServerConfig):
    """The flags as one node of a group sees them: its share of the ranks."""

    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str = ""

    @property
    def layout(self) -> Layout:
        whole = Layout.of(self.args)
        if whole.tp_size % self.nnodes == 0:
            return Layout.of({**self.args, "tp_size": whole.tp_size // self.nnodes})
        return Layout.of({**self.args, "pp_size": max(1, whole.pp_size // self.nnodes)})

    @classmethod
    def of(cls, cfg: ServerConfig) -> NodeConfig:
        a = cfg.args
        return cls(
            **{f.name: getattr(cfg, f.name) for f in fields(ServerConfig)},
            nnodes=max(1, int(a.get("nnodes") or 1)),
            node_rank=int(a.get("node_rank") or 0),
            dist_init_addr=str(a.get("dist_init_addr") or ""),
        )

    def address(self) -> tuple[str, int]:
        host, _, port = self.dist_init_addr.rpartition(":")
        if not host or not port.isdigit():
            raise ServerFailure(
                [f"ValueError: --dist-init-addr {self.dist_init_addr!r} is not host:port"]
            )
        return host, int(port)


def dirty_gpus(env: SimEnv, layout: Layout) -> list[str]:
    """This node's GPUs (of ``layout``) holding memory of a live process: not free."""
    ids = {layout.gpu_id(r) for r in range(layout.ranks)}  # ranks of one node: checked before
    used = {env.visible_gpus[i].lower() for i in ids if i < len(env.visible_gpus)}
    return [
        f"pid {r.pid} holds {r.bytes / 2**30:.1f} GiB on {r.gpu_uuid}"
        for r in read_registry(env.registry)
        if r.gpu_uuid.lower() in used and r.pid != os.getpid() and holds_memory(r)
    ]


def _sleep_until(until: float) -> bool:
    """A wait for ``Children.wait_registered`` on a node that ignores stop signals."""
    time.sleep(max(0.0, min(0.02, until - time.monotonic())))
    return False


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def _recv(conn: socket.socket, buffer: bytearray) -> dict[str, Any] | None:
    """One message; None at EOF. Raises ``TimeoutError`` per the socket's timeout."""
    while b"\n" not in buffer:
        chunk = conn.recv(4096)
        if not chunk:
            return None
        buffer.extend(chunk)
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    data: dict[str, Any] = json.loads(line)
    return data


class GroupLeader(Launcher):
    """Node 0: the ordinary launcher (HTTP, generation), plus the rendezvous."""

    def __init__(self, cfg: NodeConfig, env: SimEnv, model: ModelSpec | None = None) -> None:
        super().__init__(cfg, env, model)
        self.node = cfg
        self._peers: list[socket.socket] = []
        #: Each peer's node rank and what it sent that was not read yet.
        self._ranks: dict[socket.socket, int] = {}
        self._buffers: dict[socket.socket, bytearray] = {}
        #: Collectives every node took part in (``/health_generate`` waits for the next).
        self._rounds = 0
        self._round_done = threading.Condition()

    def _check_gpus(self) -> None:
        super()._check_gpus()
        self._rendezvous()

    def _rendezvous(self) -> None:
        """Every node meets here; one node's busy GPUs fail the whole group."""
        host, port = self.node.address()
        server = socket.create_server((host, port), reuse_port=False)
        server.settimeout(0.1)
        deadline = time.monotonic() + _seconds("SGLANG_SIM_RENDEZVOUS_S", 60.0)
        reports = {0: dirty_gpus(self.env, self.cfg.layout)}
        log(f"Rendezvous at {host}:{port}: waiting for {self.node.nnodes - 1} node(s)", "TP0")
        try:
            while len(reports) < self.node.nnodes:
                if self._wait(time.monotonic() + 0.01):
                    raise ServerFailure(["Received a stop signal during the rendezvous"])
                if time.monotonic() >= deadline:
                    raise ServerFailure(
                        [
                            f"RuntimeError: only {len(reports)} of {self.node.nnodes} nodes "
                            f"reached the rendezvous at {host}:{port}"
                        ]
                    )
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                conn.settimeout(10.0)
                hello = _recv(conn, bytearray())
                if hello is None:
                    conn.close()
                    continue
                reports[int(hello["node_rank"])] = list(hello.get("dirty", []))
                self._peers.append(conn)
                self._ranks[conn] = int(hello["node_rank"])
                self._buffers[conn] = bytearray()
        finally:
            server.close()
        dirty = {rank: d for rank, d in reports.items() if d}
        verdict = "go" if not dirty else "fail"
        for conn in self._peers:
            _send(conn, {"verdict": verdict})
        if dirty:
            where = "; ".join(f"node {rank}: {', '.join(d)}" for rank, d in sorted(dirty.items()))
            raise ServerFailure([f"RuntimeError: {UNBALANCED} ({where})"], "TP0")
        log(f"All {self.node.nnodes} nodes at the rendezvous", "TP0")

    def _collective(self) -> None:
        """One step every node takes part in (module docstring): node 0 waits for each."""
        n = self._rounds + 1
        watchdog = _seconds("SGLANG_SIM_NODE_WATCHDOG_S", 30.0)
        deadline = time.monotonic() + watchdog
        for conn in self._peers:
            rank = self._ranks[conn]
            try:
                _send(conn, {"step": n})
                while True:
                    conn.settimeout(max(0.01, deadline - time.monotonic()))
                    message = _recv(conn, self._buffers[conn])
                    if message is None:
                        raise ServerFailure(
                            [f"RuntimeError: node {rank} left a collective: a rank there is gone"],
                            "TP0",
                        )
                    if message.get("ack") == n:
                        break
            except TimeoutError:
                raise ServerFailure(
                    [
                        f"Watchdog caught collective operation timeout: node {rank} took no "
                        f"part for {watchdog:g}s"
                    ],
                    "TP0",
                ) from None
            except OSError as exc:
                raise ServerFailure(
                    [f"RuntimeError: node {rank} left a collective: {exc}"], "TP0"
                ) from exc
        with self._round_done:
            self._rounds = n
            self._round_done.notify_all()

    def _tick(self) -> None:
        if self._peers and self.phase in (Phase.READY, Phase.DRAINING):
            self._collective()
        super()._tick()

    def _set_phase(self, new: Phase, reason: str) -> None:
        if new is Phase.READY and self._peers:
            self._collective()  # the warm-up: every node's ranks take part
        super()._set_phase(new, reason)

    def health(self, generate: bool) -> tuple[int, str]:
        """/health_generate is a generation: it waits for the next collective, up to
        SGLang's health-check timeout, then answers 503 as SGLang does."""
        if generate and self.phase is Phase.READY and self.healthy and self._peers:
            timeout = _seconds("SGLANG_HEALTH_CHECK_TIMEOUT", 20.0)
            with self._round_done:
                seen = self._rounds
                if not self._round_done.wait_for(lambda: self._rounds > seen, timeout):
                    log(
                        "Health check failed. Server couldn't get a response from detokenizer "
                        f"for last {timeout:g} seconds."
                    )
                    return 503, "unhealthy"
        return super().health(generate)

    def run(self) -> int:
        rc = super().run()
        if rc == 0:  # the graceful exit's broadcast (SGLang's ShutdownReq to every rank)
            for conn in self._peers:
                try:
                    _send(conn, {"shutdown": True})
                except OSError:
                    continue
        for conn in self._peers:
            conn.close()
        return rc


class WorkerNode:
    """A node ≥ 1: its ranks, no HTTP, SIGTERM ignored, gone at the leader's shutdown."""

    def __init__(self, cfg: NodeConfig, env: SimEnv, model: ModelSpec | None = None) -> None:
        self.cfg = cfg
        self.env = env
        resolved = capacity.resolve(model or capacity.SIM_MODEL, cfg.args, env.memory_bytes)
        self.rank_bytes = int(resolved.mem_fraction_static * env.memory_bytes)
        self.children = Children(env.registry, env.faults)
        self.who = f"node{cfg.node_rank}"

    def _ignore(self, signum: int, frame: FrameType | None) -> None:
        log(
            f"Received {signal.Signals(signum).name} on node {self.cfg.node_rank}: ignored "
            "(nodes other than 0 wait for the leader's shutdown)",
            self.who,
        )

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._ignore)
        signal.signal(signal.SIGINT, self._ignore)
        try:
            conn = self._meet()
            return self._serve(conn)
        except ServerFailure as exc:
            for line in exc.lines:
                log(line, self.who)
            self.children.stop(0.0)
            return 1

    def _meet(self) -> socket.socket:
        """Connect to node 0 (it may not listen yet), report this node's GPUs, await the
        verdict."""
        host, port = self.cfg.address()
        deadline = time.monotonic() + _seconds("SGLANG_SIM_RENDEZVOUS_S", 60.0)
        while True:
            try:
                conn = socket.create_connection((host, port), timeout=5.0)
                break
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise ServerFailure(
                        [f"RuntimeError: cannot reach node 0 at {host}:{port}: {exc}"]
                    ) from exc
                time.sleep(0.05)
        dirty = dirty_gpus(self.env, self.cfg.layout)
        _send(conn, {"node_rank": self.cfg.node_rank, "dirty": dirty})
        conn.settimeout(max(1.0, deadline - time.monotonic()))
        try:
            answer = _recv(conn, bytearray())
        except TimeoutError:
            answer = None
        if answer is None or answer.get("verdict") != "go":
            why = f" (this node: {', '.join(dirty)})" if dirty else ""
            raise ServerFailure([f"RuntimeError: {UNBALANCED}{why}"])
        return conn

    def _serve(self, conn: socket.socket) -> int:
        cfg = self.cfg
        layout = cfg.layout
        gpus = [self.env.visible_gpus[layout.gpu_id(r)] for r in range(layout.ranks)]
        self.children.spawn(gpus, self.rank_bytes)
        # Its ranks take part in collectives once they are up (node 0's warm-up waits).
        self.children.wait_registered(_sleep_until)
        log(f"{len(gpus)} ranks started on node {cfg.node_rank}", self.who)
        conn.settimeout(0.1)
        buffer = bytearray()
        orphaned_at: float | None = None
        watchdog = _seconds("SGLANG_SIM_NODE_WATCHDOG_S", 30.0)
        while True:
            self.children.check_alive()
            if orphaned_at is not None:
                if time.monotonic() - orphaned_at >= watchdog:
                    raise ServerFailure(
                        [
                            f"Watchdog caught collective operation timeout: node 0 gone for "
                            f"{watchdog:g}s"
                        ]
                    )
                time.sleep(0.1)
                continue
            try:
                message = _recv(conn, buffer)
            except TimeoutError:
                continue
            if message is None:
                log("Lost node 0 without a shutdown: waiting in the collective", self.who)
                orphaned_at = time.monotonic()
                continue
            if "step" in message:  # this node's part in node 0's collective
                _send(conn, {"ack": message["step"]})
            if message.get("shutdown"):
                log("Shutdown broadcast from node 0: stopping", self.who)
                self.children.stop(5.0)
                return 0


def run_node(cfg: ServerConfig, env: SimEnv, model: ModelSpec | None) -> int:
    """Serve this node's share of a group (``--nnodes`` > 1)."""
    node = NodeConfig.of(cfg)
    if node.node_rank == 0:
        return GroupLeader(node, env, model).run()
    return WorkerNode(node, env, model).run()
