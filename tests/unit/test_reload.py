"""A reload never blocks the daemon (issue 27 §2): the files it reads are regular files,
bounded, read with a deadline (``sglang_supervisor.files``); a refusal shows in /status;
and a start-up crash-looping on the config's levers yields to a reconcile of the edit."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor import files
from sglang_supervisor.config import ApiSettings, ServerSettings, Settings, load_settings
from sglang_supervisor.files import FileRefused, read_regular
from sglang_supervisor.operations import FAILED
from sglang_supervisor.phases import OpKind
from sglang_supervisor.states import ServerState as S
from sglang_supervisor_api.auth import ApiAccess
from sglang_supervisor_api.reconcile import after_sighup
from sglang_supervisor_api.reload import Reloader, reread
from tests.unit.engine.common import ops_of
from tests.unit.fakes import INITIAL_LEVERS, Behaviour, make_rig, run, until


def test_what_could_block_is_refused_at_once_and_named(tmp_path: Path) -> None:
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)  # no writer: an open() for reading waits for one, forever
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2049)
    refused = {
        fifo: "is a FIFO (named pipe), not a regular file",
        Path("/dev/zero"): "is a character device, not a regular file",
        tmp_path: "is a directory, not a regular file",
        big: "is larger than 2048 bytes",
    }
    for path, why in refused.items():
        with pytest.raises(FileRefused) as err:
            read_regular(path, "config", max_bytes=2048)
        assert str(err.value).startswith(f"config {path} {why}"), err.value
    good = tmp_path / "good.toml"
    good.write_text("x = 1\n")
    link = tmp_path / "link.toml"  # a ConfigMap is links: they are followed
    link.symlink_to(good)
    assert read_regular(link, "config").text() == "x = 1\n"
    # /dev/null is the usual "no file" (the CLI passes it for an unreadable system
    # config): empty, never blocking, read as empty where /dev/zero is refused.
    assert read_regular(os.devnull, "config").text() == ""
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "missing", "config")


def test_a_read_that_hangs_is_refused_at_its_deadline_and_never_started_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hung NFS or FUSE mount: the read waits in the kernel. The caller gets an answer
    at the deadline; the file is not read again (another stuck thread) until it returns."""
    path = tmp_path / "token"
    path.write_text("t0k3n\n")
    mount_back = threading.Event()
    real = files._read

    def hung(p: str | Path, what: str, max_bytes: int) -> files.FileRead:
        mount_back.wait(30)
        return real(p, what, max_bytes)

    monkeypatch.setattr(files, "_read", hung)
    with pytest.raises(FileRefused, match=r"could not be read within 0.2 s \(a hung network"):
        read_regular(path, "token file", timeout_s=0.2)
    with pytest.raises(FileRefused, match="an earlier read of it has not returned"):
        read_regular(path, "token file", timeout_s=0.2)
    mount_back.set()
    monkeypatch.setattr(files, "_read", real)

    def answered() -> bool:
        try:
            return read_regular(path, "token file").text() == "t0k3n\n"
        except FileRefused:
            return False  # the stuck thread has not noted its return yet

    run(lambda: until(answered, 5, "the read once the mount is back"))


def test_a_fifo_token_file_or_certificate_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    key = tmp_path / "key.pem"
    key.write_text("not a key")
    key.chmod(0o600)
    running = Settings(
        simulate=True,
        state_dir=tmp_path / "state",
        api=ApiSettings(ssl_certfile=str(fifo), ssl_keyfile=str(key)),
    )
    token = Settings(simulate=True, api=ApiSettings(token_file=str(fifo)))
    got = reread(lambda: token, running)
    assert got.settings is token and got.tokens is None
    assert got.token_error is not None and f"token file {fifo} is a FIFO" in got.token_error
    assert got.tls_error is not None and f"ssl_certfile {fifo} is a FIFO" in got.tls_error


def test_a_refused_reload_shows_in_status_until_one_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[server\n")  # bad TOML
    rig = make_rig(tmp_path / "state")

    async def main() -> None:
        await rig.start_ready()
        reloader = Reloader(
            lambda: load_settings(config, {"simulate": True}),
            rig.settings,
            ApiAccess(token=None),
            log_level_pinned=False,
            on_new=lambda new: [],
            tls_context=lambda: None,
            warn=rig.sup.warn,
            resolve=rig.sup.warning_resolved,
        )

        async def reloaded() -> list[str]:
            nonlocal reloader_task
            reloader.request()
            assert reloader.task is not None
            reloader_task = reloader.task
            await reloader.task
            return [w for w in rig.sup.view().warnings if w.startswith("reload (SIGHUP)")]

        (shown,) = await reloaded()
        assert f"the config does not load, nothing changed: config {config} is not valid TOML" in (
            shown
        )
        os.remove(config)
        os.mkfifo(config)
        (shown,) = await reloaded()  # the earlier refusal is replaced, not kept beside it
        assert f"config {config} is a FIFO (named pipe)" in shown and "TOML" not in shown
        os.remove(config)
        config.write_text("[timeouts]\nprobation_s = 0.06\n")
        assert await reloaded() == []
        assert rig.settings.timeouts.probation_s == 0.06
        # A hung mount: the loop runs on (the API, the watcher, a SIGTERM) while the
        # reload waits for its read, which is refused at the deadline.
        monkeypatch.setattr(files, "READ_TIMEOUT_S", 0.3)
        monkeypatch.setattr(files, "_read", lambda *a: mount_back.wait(30))
        loop_ran: list[bool] = []
        asyncio.get_running_loop().call_later(0.05, lambda: loop_ran.append(done()))
        (shown,) = await reloaded()
        assert loop_ran == [False], "the event loop waited for the reload's read"
        assert "could not be read within 0.3 s" in shown, shown
        mount_back.set()
        await rig.sup.shutdown()

    mount_back = threading.Event()

    def done() -> bool:
        return reloader_task is not None and reloader_task.done()

    reloader_task: asyncio.Task[None] | None = None
    run(main)


def test_a_crash_looping_start_up_yields_to_the_reconcile_of_an_edited_config(
    tmp_path: Path,
) -> None:
    """``levers_source = "config"`` and levers that crash at start: the start-up retries
    them until its crash loop ends. The fix is an edit and a SIGHUP; its reconcile was
    refused as busy for the whole loop (36 s measured). It now waits for the loop's next
    backoff, which yields to it, and its levers end the loop."""
    rig = make_rig(
        tmp_path,
        backoff_initial_s=0.2,
        backoff_max_s=0.2,
        crash_loop_count=1000,
        crash_loop_window_s=600.0,
    )
    rig.procs.default = Behaviour(never_ready=True)  # the config's 0.8 never gets ready...
    rig.procs.when("--mem-fraction-static", "0.7", Behaviour())  # ...the edit's 0.7 can
    edited: dict[str, Any] = {**INITIAL_LEVERS, "mem_fraction_static": 0.7}
    new = Settings(
        simulate=True,
        state_dir=tmp_path,
        server=ServerSettings(levers=edited, levers_source="config"),
    )

    async def main() -> None:
        await rig.sup.start()
        (start,) = ops_of(rig, OpKind.START)
        # SIGHUP while a retry starts (ready_timeout_s 0.5 s): busy, until its backoff.
        await until(
            lambda: len(rig.procs.spawns) >= 2 and rig.sup.state == S.STARTING,
            10,
            "the start-up's crash loop",
        )
        tasks: set[asyncio.Task[Any]] = set()
        after_sighup(rig.sup, new, tasks)
        await until(
            lambda: rig.sup.state == S.READY and rig.sup.operation is None and not tasks,
            10,
            "the edited levers serving",
        )
        assert rig.sup.levers.levers["mem_fraction_static"] == 0.7
        assert start.state == FAILED and "superseded" in (start.error or ""), start.error
        (reconcile,) = ops_of(rig, OpKind.APPLY)
        assert reconcile.state == "succeeded", reconcile.error
        last = rig.sup.view().desired
        assert last is not None and last.last_reconcile is not None
        assert last.last_reconcile["outcome"] == "accepted"
        assert not [w for w in rig.sup.view().warnings if "reconcile" in w]
        await rig.sup.shutdown()

    run(main)
