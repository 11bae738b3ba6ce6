"""The per-node presence (supervisor/slurm/presence.py) over a stand-in srun on this host
(tests/fake_srun.py: one task per node, stdin to all, labelled stdout cut in 1 KiB pieces
as srun cuts it), running the real agent (supervisor/slurm/agent.py) on simulated GPUs.

What a caller sees: every node answers one question at once and long answers come back
whole; a reader gets each node's last sample with its age without waiting, even while a
node is frozen, and a question then fails naming that node; a presence that dies is
launched again (a new step) at the next question; a step Slurm refuses is counted with
srun's own words and not asked for again before its back-off; closing it ends every task.
The real cluster's side of it (no job step per question, counted from Slurm's own step
ids) is tests/slurm/test_steps.py.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sglang_supervisor.host.gpu import GpuQueryError
from sglang_supervisor.sim.gpus import prepare_registry, sim_gpu_uuid
from sglang_supervisor.slurm.presence import Presence
from sglang_supervisor.slurm.probe import SlurmGpuProbe
from sglang_supervisor.slurm.settings import SlurmSettings
from tests.helpers import TAG_ENV, wait_until

FAKE_SRUN = Path(__file__).resolve().parents[1] / "fake_srun.py"
NODES = ("n1", "n2")


def make_presence(tmp: Path, **env: str) -> Presence:
    srun = tmp / "srun"
    exports = "".join(f"export {k}='{v}'\n" for k, v in env.items())
    srun.write_text(f'#!/bin/sh\n{exports}exec {sys.executable} {FAKE_SRUN} "$@"\n')
    srun.chmod(0o755)
    registry = tmp / "gpus"
    for node in NODES:
        prepare_registry(registry / node)
    settings = SlurmSettings(srun=str(srun), probe_timeout_s=3.0, sample_interval_s=0.2)
    args = ("--sim-registry", str(registry), "--sim-gpus", "8", "--sim-mib", "1000")
    # A prefix of this test's own: tests beside it (xdist) run presences too.
    prefix = f"sgs-unit-presence-{os.getpid()}-{tmp.name}."
    return Presence(settings, "7", NODES, args, tag_prefix=prefix)


@pytest.fixture
def presence(tmp_path: Path) -> Iterator[Presence]:
    p = make_presence(tmp_path, FAKE_SRUN_STEPS=str(tmp_path / "steps"))
    try:
        yield p
    finally:
        p.close()


def agent_pids(presence: Presence, node: str) -> list[int]:
    """The agent task of ``presence`` on ``node`` (a child of the stand-in srun)."""
    out = []
    for p in psutil.process_iter(["cmdline", "environ"]):
        cmd = p.info["cmdline"] or []
        env = p.info["environ"] or {}
        ours = "sglang_supervisor.slurm.agent" in cmd and presence.tag_prefix in cmd
        if ours and env.get("SLURMD_NODENAME") == node:
            out.append(p.pid)
    return out


def test_every_node_answers_at_once_and_long_answers_come_back_whole(
    presence: Presence, tmp_path: Path
) -> None:
    answers = presence.ask([])
    assert sorted(answers) == ["n1", "n2"]
    # 8 GPUs' JSON is longer than srun's 1 KiB pieces: joined, it parses.
    assert len(json.dumps(answers["n2"])) > 1024
    assert [g["uuid"] for g in answers["n2"]["gpus"]] == [sim_gpu_uuid(i) for i in range(8)]
    # One step for the presence's life, whatever is asked.
    for _ in range(5):
        presence.ask(["--no-gpus", "--tag-prefix", presence.tag_prefix])
    assert (tmp_path / "steps").read_text() == "1"
    assert presence.launches == 1


def test_readers_get_the_last_sample_with_its_age_and_never_wait_on_a_frozen_node(
    presence: Presence,
) -> None:
    probe = SlurmGpuProbe(presence, "simulated")
    assert len(probe.devices()) == 16
    wait_until(lambda: len(presence.latest()) == 2, 10, 0.05, "both nodes sampled")
    frozen = agent_pids(presence, "n2")
    assert len(frozen) == 1
    os.kill(frozen[0], signal.SIGSTOP)
    try:
        # n1 goes on sampling; n2's last sample only ages.
        got = wait_until(
            lambda: (
                (r := probe.recent(list(range(16))))
                and {s.node: s.age_s for s in r.samples}["n2"] > 1.0
                and r
            ),
            10,
            0.05,
            "n2's sample ageing",
        )
        ages = {s.node: s.age_s for s in got.samples}
        assert ages["n1"] is not None and ages["n1"] < 1.0, ages
        assert not got.errors and len(got.samples) == 16
        # A fresh question waits for n2 up to the probe's deadline, then names it.
        with pytest.raises(GpuQueryError, match=r"node\(s\) n2 did not answer .* within 3s"):
            probe.sample([3, 12])
        assert probe.sample([3])[0].node == "n1"  # n1 alone still answers at once
        status = presence.status_json()
        assert status["state"] == "up" and status["sample_age_s"]["n2"] > 1.0
    finally:
        os.kill(frozen[0], signal.SIGCONT)


def test_a_presence_that_dies_is_launched_again_at_the_next_question(
    presence: Presence, tmp_path: Path
) -> None:
    presence.ask(["--no-gpus"])
    for pid in agent_pids(presence, "n1"):
        os.kill(pid, signal.SIGKILL)  # --kill-on-bad-exit ends the whole step
    wait_until(lambda: presence.status_json()["state"] == "down", 10, 0.05, "the presence down")
    assert presence.deaths == 1 and "srun exited" in (presence.last_exit or "")
    # The back-off after a death is 1 s: the question after it launches a new step.
    wait_until(lambda: _asks(presence), 10, 0.2, "the presence launched again")
    assert presence.launches == 2
    assert (tmp_path / "steps").read_text() == "2"


def _asks(presence: Presence) -> bool:
    try:
        presence.ask(["--no-gpus"])
    except GpuQueryError:
        return False
    return True


def test_a_step_slurm_refuses_is_counted_with_sruns_words_and_backed_off(tmp_path: Path) -> None:
    p = make_presence(tmp_path, FAKE_SRUN_REFUSE="Step limit reached for this job")
    try:
        with pytest.raises(GpuQueryError, match="Step limit reached for this job"):
            p.ask([])
        assert p.refusals == 1 and p.launches == 1
        assert "Unable to create step for job 7: Step limit reached" in (p.last_refusal or "")
        # Within the back-off, no new step is asked of Slurm: the question fails at once.
        with pytest.raises(GpuQueryError, match="relaunched in"):
            p.ask([])
        assert p.launches == 1
        assert p.status_json()["state"] == "down"
    finally:
        p.close()


def test_our_processes_are_sampled_with_their_state(presence: Presence) -> None:
    import subprocess

    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"],
        env={**os.environ, TAG_ENV: presence.tag_prefix + "abc", "SLURMD_NODENAME": "n2"},
    )
    try:
        os.kill(child.pid, signal.SIGSTOP)

        def seen() -> list[list[object]]:
            s = presence.latest().get("n2")
            return [p for p in (s.data["procs"] if s else []) if p[0] == child.pid]

        presence.ask(["--no-gpus"])
        procs = wait_until(seen, 10, 0.05, "the tagged process sampled on n2")
        assert procs[0][1:3] == [presence.tag_prefix + "abc", "stopped"]
        n1 = presence.latest()["n1"].data["procs"]
        assert child.pid not in [p[0] for p in n1]  # another node's process
    finally:
        child.kill()
        child.wait(10)


def test_closing_ends_every_task(tmp_path: Path) -> None:
    p = make_presence(tmp_path)
    p.ask([])
    tasks = agent_pids(p, "n1") + agent_pids(p, "n2")
    assert len(tasks) == 2
    p.close()
    wait_until(lambda: not any(psutil.pid_exists(t) for t in tasks), 10, 0.05, "tasks gone")
    with pytest.raises(GpuQueryError, match="closed"):
        p.ask([])


def test_a_question_never_blocks_on_a_full_stdin(tmp_path: Path) -> None:
    """srun stops reading its stdin when a node's task stops reading: the question gives
    up at its deadline instead of blocking the thread that asked (and every later one)."""
    import subprocess
    import time

    p = make_presence(tmp_path)
    reader = subprocess.Popen(["sleep", "30"], stdin=subprocess.PIPE, text=True)
    try:
        assert reader.stdin is not None
        os.set_blocking(reader.stdin.fileno(), False)
        t0 = time.monotonic()
        assert not p._write(reader, b"x" * 2**22, deadline=p.clock() + 0.2)  # 4 MiB
        assert time.monotonic() - t0 < 5  # a guard: it gave up, it did not block
    finally:
        reader.kill()
        reader.wait(10)
