"""Stopping every member of a launch, in stages that let SGLang drain its own requests.

SGLang 0.5.23 handles SIGTERM in its launcher only (the process we spawn, leader of its
process group): ``tokenizer_manager.py:2455`` installs ``SignalHandler.sigterm_handler``,
which sets ``gracefully_exit`` (``:4066-4070``); ``sigterm_watchdog`` (``:3508-3548``)
looks every 5 s, keeps serving until no request is left (no deadline of its own, unless
the server is unhealthy or ``SGL_FORCE_SHUTDOWN`` is set), sends its schedulers a
``ShutdownReq`` (they release pinned host memory in userspace, ``scheduler.py:6392``) and
ends the rest with ``kill_process_tree(os.getpid(), include_parent=False)``
(``utils/common.py:2507``). Its scheduler and detokenizer processes install no SIGTERM
handler (``scheduler.py:6257-6300``, ``detokenizer_manager.py:545-569``: only
``kill_itself_when_parent_died``, ``utils/common.py:3432``, a SIGKILL when the launcher
dies): a SIGTERM kills them at once, the launcher's ``SubprocessWatchdog``
(``utils/watchdog.py:211-222``) sees a child die with a non-zero status and SIGQUITs the
launcher, whose handler kills the whole tree (``tokenizer_manager.py:4072-4082``). So a
SIGTERM sent to the group, or to every member at once, cuts every request in flight.

Hence the staged stop (docs/design.md "Teardown"; membership rules unchanged):

1. SIGTERM to the launcher alone;
2. wait up to ``grace_s`` for it to exit (it drains and ends its own workers); a forced
   stop (``grace_s`` 0) does not wait;
3. SIGTERM to the group (while the launcher lives) and to every member still alive (ranks
   that called ``setsid``, orphans found by tag), and a short wait: what is left of the
   grace, at most ``MEMBER_TERM_S`` (the whole grace when there was no launcher to drain);
4. SIGKILL to every survivor (members re-scanned first), wait up to ``kill_timeout_s``,
   reap.

The total stays within ``grace_s + kill_timeout_s``. Nothing here touches a process
outside the members (``sglang_supervisor.host.process.find_members``).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import psutil

from sglang_supervisor.host.process import Launch, _alive, _killpg, _signal, find_members, reap

#: Longest wait after SIGTERM to the members left once the launcher's own stop is over:
#: a rank that honours SIGTERM exits in well under a second (pinned host memory aside,
#: which a SIGKILL frees no faster: docs/design.md "Teardown").
MEMBER_TERM_S = 5.0

#: Which stage ended the teardown.
Stage = Literal["nothing", "launcher", "sigterm", "sigkill", "survivors"]


@dataclass
class Survivor:
    pid: int
    status: str
    cmdline: str

    def describe(self) -> str:
        why = {
            psutil.STATUS_DISK_SLEEP: "in uninterruptible sleep (D state: stuck in the kernel "
            "or the GPU driver; only the driver or a reboot frees it)",
            psutil.STATUS_ZOMBIE: "a zombie nobody has reaped",
            psutil.STATUS_STOPPED: "stopped (SIGSTOP / ptrace)",
        }.get(self.status, f"state {self.status}")
        return f"pid {self.pid} ({self.cmdline[:80]}) is {why}"


@dataclass
class TeardownReport:
    members: list[int] = field(default_factory=list)
    #: Every pid that got SIGTERM: the launcher (stage 1), then the members left (stage 3).
    sigterm_sent: list[int] = field(default_factory=list)
    sigkill_sent: list[int] = field(default_factory=list)
    #: Seconds from the first signal until no member was left (None: some survived).
    exit_s: float | None = None
    #: Seconds from the first signal until SIGKILL was needed (None: SIGTERM sufficed).
    kill_after_s: float | None = None
    survivors: list[Survivor] = field(default_factory=list)
    #: The launcher that got the first SIGTERM alone (None: it had exited already).
    launcher: int | None = None
    #: The grace the launcher was given to drain and exit (0: a forced stop).
    grace_s: float = 0.0
    #: Seconds from its SIGTERM until the launcher exited by itself within the grace.
    launcher_exit_s: float | None = None
    #: The wait for the launcher was cut short (a shutdown forced meanwhile).
    grace_cut: bool = False
    #: Members still alive after the launcher's stage that got a SIGTERM of their own.
    members_sigterm: list[int] = field(default_factory=list)
    ended_by: Stage = "nothing"

    @property
    def clean(self) -> bool:
        return not self.survivors

    def describe(self) -> str:
        if not self.members:
            return "no member process was running"
        parts = [self._launcher_part()]
        n = len(self.members_sigterm)
        if n:
            parts.append(f"{n} member{'s' if n != 1 else ''} still running got SIGTERM")
        else:
            parts.append("no member needed a SIGTERM of its own")
        if self.sigkill_sent:
            after = f" after {self.kill_after_s:.2f}s" if self.kill_after_s is not None else ""
            parts.append(f"SIGKILL to {self.sigkill_sent}{after}")
        if self.clean:
            parts.append(f"{len(self.members)} member processes exited in {self.exit_s:.2f}s")
        else:
            parts.append("; ".join(s.describe() for s in self.survivors))
        return "; ".join(parts)

    def _launcher_part(self) -> str:
        if self.launcher is None:
            return "the launcher had exited already"
        if self.launcher_exit_s is not None:
            return (
                f"launcher (pid {self.launcher}) drained and exited in {self.launcher_exit_s:.2f}s"
            )
        if self.grace_s <= 0:
            return f"forced stop: launcher (pid {self.launcher}) not given time to drain"
        if self.grace_cut:
            return f"forced stop: launcher (pid {self.launcher}) still draining when it came"
        return (
            f"launcher (pid {self.launcher}) still running after the {self.grace_s:g}s grace "
            "(stop_grace_s)"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "members": self.members,
            "sigterm_sent": self.sigterm_sent,
            "sigkill_sent": self.sigkill_sent,
            "exit_s": self.exit_s,
            "kill_after_s": self.kill_after_s,
            "survivors": [s.describe() for s in self.survivors],
            "launcher": self.launcher,
            "launcher_exit_s": self.launcher_exit_s,
            "members_sigterm": self.members_sigterm,
            "ended_by": self.ended_by,
        }


def teardown(
    launch: Launch | None,
    *,
    tag: str | None = None,
    tag_prefix: str | None = None,
    exclude_tag: str | None = None,
    grace_s: float,
    kill_timeout_s: float,
    member_term_s: float = MEMBER_TERM_S,
    poll_s: float = 0.02,
    rescan_s: float = 0.25,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    cut_grace: Callable[[], bool] | None = None,
) -> TeardownReport:
    """Stop every member in stages (module docstring): SIGTERM to the launcher alone and
    up to ``grace_s`` for it to drain and exit; SIGTERM to every member left and a short
    wait; SIGKILL to the survivors and up to ``kill_timeout_s`` for them to vanish.

    Members are snapshotted before the first signal and re-scanned before the SIGTERMs of
    stage 3 and before SIGKILL, so a process spawned meanwhile is not missed.
    ``cut_grace`` is asked at every poll of the waits of stages 2 and 3: True ends them at
    once (a shutdown forced meanwhile: SIGKILL now). Blocking:
    run in a thread. Returns a report; survivors (D-state, unkillable) are listed, never
    hidden.
    """
    report = TeardownReport(grace_s=grace_s)
    members = find_members(launch, tag=tag, tag_prefix=tag_prefix, exclude_tag=exclude_tag)
    report.members = sorted(members)
    start = clock()
    last_scan = start

    def remaining(force_scan: bool = False) -> dict[int, float]:
        nonlocal last_scan
        reap(launch, members)
        # Re-scan now and then: a member may have spawned a child (a full /proc scan costs
        # milliseconds, so not at every poll). The create time guards against pid reuse.
        if force_scan or clock() - last_scan >= rescan_s:
            members.update(
                find_members(launch, tag=tag, tag_prefix=tag_prefix, exclude_tag=exclude_tag)
            )
            last_scan = clock()
        return {p: ct for p, ct in members.items() if _alive(p, ct)}

    def launcher_alive() -> bool:
        return launch is not None and not launch.poll()

    def cut() -> bool:
        return cut_grace is not None and cut_grace()

    grace_end = start + grace_s
    member_wait = grace_s
    if launch is not None and launch.pid in members and launcher_alive():
        # Stage 1: the launcher alone; it drains and ends its own workers.
        report.launcher = launch.pid
        _signal([launch.pid], signal.SIGTERM, members)
        report.sigterm_sent = [launch.pid]
        # Stage 2: up to the grace for it to exit (a forced stop does not wait).
        while launcher_alive() and clock() < grace_end and not cut():
            sleep(poll_s)
        if not launcher_alive():
            report.launcher_exit_s = clock() - start
        elif clock() < grace_end:
            report.grace_cut = True
        member_wait = min(member_term_s, max(0.0, grace_end - clock()))

    left = remaining(force_scan=True)
    if not left:
        report.ended_by = "launcher" if report.launcher is not None else "nothing"
    else:
        # Stage 3: SIGTERM to every member left; individually too, as members that called
        # setsid are not in the group.
        if launcher_alive():
            assert launch is not None
            _killpg(launch.pid, signal.SIGTERM)
        report.members_sigterm = sorted(left)
        report.sigterm_sent = sorted({*report.sigterm_sent, *left})
        _signal(sorted(left), signal.SIGTERM, left)
        deadline = clock() + member_wait
        while left and clock() < deadline and not cut():
            sleep(poll_s)
            left = remaining()
        left = remaining(force_scan=True)
        report.ended_by = "sigterm"
    if left:
        # Stage 4: SIGKILL to every survivor, also one the last re-scan turned up.
        report.ended_by = "sigkill"
        report.kill_after_s = clock() - start
        if launcher_alive():
            assert launch is not None
            _killpg(launch.pid, signal.SIGKILL)
        killed: set[int] = set()
        deadline = clock() + kill_timeout_s
        while left:
            new = {p: ct for p, ct in left.items() if p not in killed}
            _signal(sorted(new), signal.SIGKILL, new)
            killed |= set(new)
            if clock() >= deadline:
                break
            sleep(poll_s)
            left = remaining() or remaining(force_scan=True)
        report.sigkill_sent = sorted(killed)
    report.members = sorted(members)
    if not left:
        report.exit_s = clock() - start
        reap(launch, members)
        return report
    for pid in sorted(left):
        try:
            p = psutil.Process(pid)
            report.survivors.append(Survivor(pid, p.status(), " ".join(p.cmdline())))
        except psutil.Error:
            continue
    if report.survivors:
        report.ended_by = "survivors"
    else:
        report.exit_s = clock() - start
    return report
