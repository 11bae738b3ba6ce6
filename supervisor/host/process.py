"""Spawning the server's process tree, finding every member, and killing it for certain.

Members of a launch are the union of (docs/design.md "Teardown"):

* its process group and session (the launcher is spawned as a session leader);
* psutil descendants of the launcher, snapshotted *before* the first signal;
* every process whose environment carries ``SGLANG_SUPERVISOR_INSTANCE=<tag>``: set at
  spawn, inherited by all descendants, it survives re-parenting and ``setsid``.

``sglang_supervisor.host.teardown`` stops them in stages with the signal helpers here. Nothing here
touches a process outside that union.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import signal
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil

logger = logging.getLogger("supervisor")

TAG_ENV = "SGLANG_SUPERVISOR_INSTANCE"
_TAG_PREFIX = TAG_ENV.encode() + b"="
_PR_SET_CHILD_SUBREAPER = 36


@dataclass
class Launch:
    """One spawned (or adopted) server launcher: a session leader."""

    pid: int
    create_time: float
    tag: str
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    #: Exit status once known: >= 0 exit code, < 0 killed by that signal; None while
    #: running or when it exited without us being its parent (adopted launches).
    returncode: int | None = None
    _gone: bool = False

    def poll(self) -> bool:
        """True once the launcher has exited (and been reaped, when it is our child)."""
        if self._gone:
            return True
        if self.popen is not None:
            rc = self.popen.poll()
            if rc is not None:
                self.returncode = rc
                self._gone = True
            return self._gone
        self._gone = not _alive(self.pid, self.create_time)
        return self._gone

    def describe_exit(self) -> str:
        return describe_exit(self.returncode)


def describe_exit(returncode: int | None) -> str:
    """A readable line for an exit status, with a hint where one helps."""
    if returncode is None:
        return "exited (status unknown: it was not our child)"
    if returncode >= 0:
        return f"exited with code {returncode}"
    sig = -returncode
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    hint = ""
    if sig == signal.SIGKILL:
        hint = " (perhaps the host's OOM killer, or someone ran kill -9)"
    elif sig == signal.SIGSEGV:
        hint = " (a crash in native code)"
    elif sig == signal.SIGABRT:
        hint = " (aborted; often a CUDA or NCCL error, see the log)"
    return f"killed by {name}{hint}"


def set_child_subreaper() -> bool:
    """Make this process the reaper of orphaned descendants (Linux).

    Server ranks whose launcher dies are re-parented to us instead of to PID 1, which in a
    container may never reap them; we reap them in ``teardown``. Returns False where the
    call is unavailable.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _nofollow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW, 0o600)


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    tag: str,
    log_path: Path,
    cwd: Path | None = None,
) -> Launch:
    """Start ``argv`` in a new session with ``TAG_ENV=tag``, output appended to ``log_path``.

    The output goes to a file, never through a pipe: a full pipe would block the server,
    and the log must survive our own restart. A log file that cannot be written (a full or
    read-only disk) never stops a launch: the output then goes to the daemon's own
    stdout/stderr (the journal under systemd), and a warning says so. Raises ``OSError``
    when the program cannot be executed (the message names the program).
    """
    full_env = dict(env)
    full_env[TAG_ENV] = tag
    with contextlib.ExitStack() as stack:
        log: IO[bytes] | None
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            # O_NOFOLLOW: a link planted under the log's name is refused, never written
            # through (the daemon may run as root).
            log = stack.enter_context(open(log_path, "ab", opener=_nofollow))
        except OSError as exc:
            log = None
            logger.warning(
                "cannot write the server log %s (%s): its output goes to the daemon's own "
                "log instead",
                log_path,
                exc.strerror or exc,
            )
        try:
            popen = subprocess.Popen(
                list(argv),
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                cwd=cwd,
            )
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot start the server {argv[0]!r}: {exc.strerror}"
            ) from exc
    try:
        create_time = psutil.Process(popen.pid).create_time()
    except psutil.Error:
        create_time = 0.0  # exited already; poll() will tell
    return Launch(popen.pid, create_time, tag, log_path, popen)


def adopt(pid: int, create_time: float, tag: str, log_path: Path) -> Launch | None:
    """A ``Launch`` for a launcher started by an earlier daemon, if it still runs."""
    if not _alive(pid, create_time):
        return None
    return Launch(pid, create_time, tag, log_path, popen=None)


def _alive(pid: int, create_time: float | None) -> bool:
    """Whether ``pid`` (still the process created at ``create_time``) has not exited.

    A zombie whose other threads still run has not exited: the main thread of a torch
    rank often dies first while the others are still freeing the CUDA context and pinned
    host memory (measured on an H200: zombie after 6 ms, gone 0.1-1.8 s later).
    """
    try:
        p = psutil.Process(pid)
        if create_time and abs(p.create_time() - create_time) > 0.05:
            return False  # the pid was reused
        if p.status() != psutil.STATUS_ZOMBIE:
            return True
    except psutil.Error:
        return False
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def _environ_tag(pid: int) -> str | None:
    """The launch tag in ``pid``'s environment, read straight from /proc (fast, no psutil)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None
    for item in data.split(b"\0"):
        if item.startswith(_TAG_PREFIX):
            return item[len(_TAG_PREFIX) :].decode(errors="replace")
    return None


def _tag_matches(value: str | None, tag: str | None, tag_prefix: str | None) -> bool:
    if value is None:
        return False
    if tag is not None and value == tag:
        return True
    return tag_prefix is not None and value.startswith(tag_prefix)


def find_members(
    launch: Launch | None,
    *,
    tag: str | None = None,
    tag_prefix: str | None = None,
    exclude_tag: str | None = None,
) -> dict[int, float]:
    """Every member process that has not exited, as ``{pid: create_time}``.

    ``tag`` matches one launch exactly; ``tag_prefix`` every launch of this instance
    (leftovers of an earlier daemon), except the launch tagged ``exclude_tag`` (a server
    being adopted). This process and its ancestors are never members.
    """
    me = os.getpid()
    never = {me, *(p.pid for p in psutil.Process(me).parents())}
    members: dict[int, float] = {}

    def add(p: psutil.Process) -> None:
        if p.pid in never:
            return
        with contextlib.suppress(psutil.Error):
            ct = p.create_time()
            if _alive(p.pid, ct):  # one definition of "exited", zombies with live threads too
                members[p.pid] = ct

    leader = launch.pid if launch is not None and not launch.poll() else None
    if leader is not None:
        with contextlib.suppress(psutil.Error):
            lp = psutil.Process(leader)
            add(lp)
            for child in lp.children(recursive=True):
                add(child)
    grouped: list[int] = []
    # The launcher's pid names its group and session. While the launcher lives, or while a
    # tagged member still sits in that group, the kernel cannot hand the number to anyone
    # else; once both are gone it may belong to a stranger's new session: then only tags.
    group_is_ours = leader is not None
    for pid in psutil.pids():
        if pid in members or pid in never:
            continue
        in_group = False
        if launch is not None:
            try:
                in_group = launch.pid in (os.getpgid(pid), os.getsid(pid))
            except OSError:
                continue
        found = _environ_tag(pid)
        if exclude_tag is not None and found == exclude_tag:
            continue
        if _tag_matches(found, tag, tag_prefix):
            group_is_ours = group_is_ours or in_group
            with contextlib.suppress(psutil.Error):
                add(psutil.Process(pid))
        elif in_group:
            grouped.append(pid)  # no tag (a cleared environment): ours only if the group is
    if group_is_ours:
        for pid in grouped:
            with contextlib.suppress(psutil.Error):
                add(psutil.Process(pid))
    return members


def _signal(pids: Iterable[int], sig: signal.Signals, alive: Mapping[int, float]) -> None:
    for pid in pids:
        if not _alive(pid, alive.get(pid)):
            continue  # gone, or the pid now belongs to another process
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass  # ESRCH: already gone
        except PermissionError:
            pass  # not ours after all (pid reused by another user); the re-scan decides


def _killpg(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError as exc:
        if exc.errno not in (errno.ESRCH, errno.EPERM):
            raise


def reap(launch: Launch | None, pids: Iterable[int]) -> None:
    """Collect exit statuses of our dead children among ``pids`` (and the launcher).

    Orphaned ranks are re-parented to us when we are a child subreaper; a zombie holds no
    memory, but left unreaped it lingers in every process listing.
    """
    if launch is not None:
        launch.poll()
    for pid in pids:
        if launch is not None and pid == launch.pid and launch.popen is not None:
            continue  # Popen owns its status
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
