"""A stuck node of the server's step, seen in the per-node presence's samples.

At ``tp_size 16`` over two nodes every step of SGLang's scheduler is a collective over all
ranks, so one frozen node (an NCCL hang, an Xid, a process in D state, a SIGSTOP) hangs
the leader, whose own probes only say "no answer". Each node's sample lists our processes
with their state (``sglang_supervisor.slurm.agent``): a node of the step on which a
process of the launch has been stopped or in uninterruptible sleep, or on which the
launch has no process at all, for ``slurm.stuck_after_s``, is stuck (``StuckWatch``): the
watcher recovers the whole group, naming the node. ``diagnosis`` says the same of every
node at once, without the wait, for a reason of the leader's own failed probes (and adds
a node whose presence has gone silent, or whose processes made no progress).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sglang_supervisor.slurm.presence import NodeSample

#: psutil's states of a process that cannot take part in a collective.
FROZEN = {"stopped": "stopped (SIGSTOP)", "tracing-stop": "stopped (traced)"}
BLOCKED = {"disk-sleep": "in uninterruptible sleep (D state)"}


def _launch_procs(sample: NodeSample, tag: str) -> list[list[Any]]:
    return [p for p in sample.data.get("procs", []) if len(p) >= 4 and p[1] == tag]


def node_trouble(sample: NodeSample, tag: str) -> str | None:
    """What keeps this node's part of launch ``tag`` from taking part (None: nothing)."""
    procs = _launch_procs(sample, tag)
    if not procs:
        return "no process of the server's task is left on it"
    for states in (FROZEN, BLOCKED):
        bad = [p for p in procs if p[2] in states]
        if bad:
            pids = ", ".join(str(p[0]) for p in bad[:4]) + (" ..." if len(bad) > 4 else "")
            return f"pid {pids} {states[bad[0][2]]}"
    return None


def frozen(samples: Mapping[str, NodeSample], tag: str, nodes: Sequence[str]) -> str | None:
    """The nodes whose processes of launch ``tag`` are stopped or in D state now: such a
    group cannot drain (every forward waits on them), so its stop has no grace."""
    said = []
    for node in nodes:
        sample = samples.get(node)
        trouble = None if sample is None else node_trouble(sample, tag)
        if trouble is not None and sample is not None and _launch_procs(sample, tag):
            said.append(f"node {node}: {trouble}")
    return "; ".join(said) or None


class StuckWatch:
    """Each node's trouble and since when (one watch per launch: a new tag starts over)."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self._tag: str | None = None
        #: node -> (its trouble, the time of the first sample that showed it).
        self._since: dict[str, tuple[str, float]] = {}

    def look(self, samples: Mapping[str, NodeSample], tag: str, nodes: Sequence[str]) -> str | None:
        """The first node of ``nodes`` stuck for ``after_s`` (its trouble and how long),
        or None. Call it with every new look at the samples."""
        if tag != self._tag:
            self._tag, self._since = tag, {}
        for node in nodes:
            sample = samples.get(node)
            if sample is None:
                continue
            trouble = node_trouble(sample, tag)
            if trouble is None:
                self._since.pop(node, None)
                continue
            first = self._since.get(node)
            if first is None or first[0] != trouble:
                first = self._since[node] = (trouble, sample.at)
            held = sample.at - first[1]
            if held >= self.after_s:
                return (
                    f"node {node} is stuck: {trouble} for {held:.0f}s "
                    f"(slurm.stuck_after_s {self.after_s:g}); every step of the group waits "
                    "on it"
                )
        return None


def diagnosis(
    samples: Mapping[str, NodeSample],
    tag: str,
    nodes: Sequence[str],
    now: float,
    silent_after_s: float,
) -> str | None:
    """Every node of ``nodes`` in trouble now, in one line (None: none seen)."""
    said = []
    for node in nodes:
        sample = samples.get(node)
        if sample is None:
            said.append(f"node {node}: never sampled")
            continue
        age = now - sample.at
        trouble = node_trouble(sample, tag)
        if trouble is not None:
            said.append(f"node {node}: {trouble}")
        elif age > silent_after_s:
            said.append(f"node {node}: its presence has not sampled for {age:.0f}s")
    return "; ".join(said) or None
