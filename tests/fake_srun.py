"""A stand-in for ``srun`` of one step on this host, for unit tests of the per-node
presence (``supervisor/slurm/presence.py``) without a cluster: ``python tests/fake_srun.py
[srun options] COMMAND...``.

Like srun: one task per node of ``--nodelist`` (environment ``SLURMD_NODENAME``,
``SLURM_NODEID``, ``SLURM_STEP_ID``), stdin copied to every task, every task's stdout
line prefixed ``<task>: `` (``--label``) and cut into 1,024-byte pieces as srun cuts them,
and with ``--kill-on-bad-exit=1`` every task killed once one exits non-zero. Its own
knob: ``FAKE_SRUN_REFUSE=<reason>`` makes it refuse the step as Slurm does (srun's error
line, exit 1), and ``FAKE_SRUN_STEPS=<file>`` counts the steps made in that file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

PIECE = 1024


def main(argv: list[str]) -> int:
    nodes: list[str] = []
    kill_on_bad_exit = False
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        if arg.startswith("--nodelist="):
            nodes = arg.split("=", 1)[1].split(",")
        elif arg == "--kill-on-bad-exit=1":
            kill_on_bad_exit = True
        i += 1
    command = argv[i:]
    refuse = os.environ.get("FAKE_SRUN_REFUSE")
    if refuse:
        print(f"srun: error: Unable to create step for job 7: {refuse}", file=sys.stderr)
        return 1
    steps = os.environ.get("FAKE_SRUN_STEPS")
    step = 0
    if steps:
        path = Path(steps)
        step = int(path.read_text() or "0") if path.exists() else 0
        path.write_text(str(step + 1))
    tasks = [
        subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={
                **os.environ,
                "SLURMD_NODENAME": node,
                "SLURM_NODEID": str(n),
                "SLURM_STEP_ID": str(step),
            },
        )
        for n, node in enumerate(nodes)
    ]
    lock = threading.Lock()

    def relay(n: int, task: subprocess.Popen[bytes]) -> None:
        assert task.stdout is not None
        for line in task.stdout:
            text = line.rstrip(b"\n")
            with lock:
                for at in range(0, max(1, len(text)), PIECE):
                    sys.stdout.buffer.write(f"{n}: ".encode() + text[at : at + PIECE] + b"\n")
                sys.stdout.flush()

    relays = [threading.Thread(target=relay, args=(n, t), daemon=True) for n, t in enumerate(tasks)]
    for r in relays:
        r.start()

    def feed() -> None:
        for chunk in iter(lambda: os.read(0, 65536), b""):
            for t in tasks:
                try:
                    assert t.stdin is not None
                    t.stdin.write(chunk)
                    t.stdin.flush()
                except OSError:
                    continue
        for t in tasks:
            try:
                assert t.stdin is not None
                t.stdin.close()
            except OSError:
                continue

    threading.Thread(target=feed, daemon=True).start()
    codes: dict[int, int] = {}
    while len(codes) < len(tasks):
        for n, t in enumerate(tasks):
            if n in codes:
                continue
            try:
                codes[n] = t.wait(0.05)
            except subprocess.TimeoutExpired:
                continue
            if codes[n] != 0 and kill_on_bad_exit:
                for other in tasks:
                    other.kill()
    for r in relays:
        r.join(5)
    return max(codes.values(), default=0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
