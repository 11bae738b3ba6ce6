"""A misbehaving process tree for teardown tests (stdlib only).

    python tree.py READY_DIR [--children N] [--grandchildren] [--ignore-term] [--setsid]
                   [--spawn-late-s S] [--untagged-orphan] [--children-ignore-term]
                   [--drain-s S]

Every process writes ``READY_DIR/<pid>`` once its signal handlers are in place, then sleeps
until killed. ``--ignore-term``: every process ignores SIGTERM. ``--setsid``: children leave
the process group and session. ``--spawn-late-s``: the leader spawns one more child that
long after receiving SIGTERM (a process born during the grace period).
``--untagged-orphan``: the leader starts, through a short-lived middle process, one more
that ignores SIGTERM, has no launch tag in its environment and is no descendant of the
leader (re-parented when the middle one exits): a member only by its process group.
``--children-ignore-term``: every process but the leader ignores SIGTERM.
``--drain-s``: the leader handles SIGTERM as SGLang 0.5.23's launcher does (module
docstring of ``sglang_supervisor.host.teardown``): it serves on for that long, then exits 1 if one
of its children died meanwhile (SGLang's SubprocessWatchdog then kills the whole tree,
cutting every request), else SIGKILLs its children, reaps them and exits 0. Its children
keep SIGTERM's default action, as SGLang's schedulers do: it kills them.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def ready(ready_dir: str) -> None:
    path = os.path.join(ready_dir, str(os.getpid()))
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("ready_dir")
    p.add_argument("--children", type=int, default=0)
    p.add_argument("--grandchildren", action="store_true")
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--setsid", action="store_true")
    p.add_argument("--spawn-late-s", type=float, default=0.0)
    p.add_argument("--untagged-orphan", action="store_true")
    p.add_argument("--children-ignore-term", action="store_true")
    p.add_argument("--drain-s", type=float, default=0.0)
    p.add_argument("--role", default="leader")
    a = p.parse_args()
    if a.role != "leader" and a.setsid:
        os.setsid()
    late: list[float] = []
    terms: list[float] = []
    if a.ignore_term or (a.children_ignore_term and a.role != "leader"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif a.role == "leader" and a.drain_s:
        signal.signal(signal.SIGTERM, lambda *_: terms.append(time.monotonic()))
    elif a.role == "leader" and a.spawn_late_s:
        signal.signal(signal.SIGTERM, lambda *_: late.append(time.monotonic()))
    base = [sys.executable, __file__, a.ready_dir]
    flags = (["--ignore-term"] if a.ignore_term else []) + (["--setsid"] if a.setsid else [])
    flags += ["--children-ignore-term"] if a.children_ignore_term else []
    kids = []
    if a.role == "leader" and a.untagged_orphan:
        untagged = {k: v for k, v in os.environ.items() if k != "SGLANG_SUPERVISOR_INSTANCE"}
        kids.append(subprocess.Popen([*base, "--role", "middle"], env=untagged))
    if a.role == "middle":  # start the orphan and leave at once: it is re-parented
        subprocess.Popen([*base, "--ignore-term", "--role", "orphan"])
        return
    if a.role == "leader":
        for _ in range(a.children):
            extra = ["--children", "1"] if a.grandchildren else []
            kids.append(subprocess.Popen([*base, *flags, *extra, "--role", "child"]))
    elif a.role == "child" and a.children:
        kids.append(subprocess.Popen([*base, *flags, "--role", "grandchild"]))
    ready(a.ready_dir)
    while True:
        if terms and time.monotonic() - terms[0] >= a.drain_s:
            if any(k.poll() is not None for k in kids):
                sys.exit(1)  # a worker died during the drain: the requests are lost
            for k in kids:
                k.kill()
                k.wait()
            sys.exit(0)
        if late and time.monotonic() - late[0] >= a.spawn_late_s:
            kids.append(subprocess.Popen([*base, "--ignore-term", "--role", "late"]))
            late.clear()
        time.sleep(0.02)


if __name__ == "__main__":
    main()
