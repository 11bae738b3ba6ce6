"""The server-log forwarder's bounds: rate, line length, truncation, new launches, flush."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path

import pytest

from sglang_supervisor.observe.logforward import MAX_LINE_CHARS, LogForwarder, Source
from sglang_supervisor.sglang.accesslog import PROBE_PATHS


def lines_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sglang"]


def test_follows_truncation_and_new_launches_from_their_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "sglang")
    first = tmp_path / "server-1.log"
    first.write_text("before the daemon\n")
    fwd = LogForwarder(lambda: None, earlier=frozenset({first}))
    src = Source(first, 11, ("hf_abcdefgh",))
    assert fwd.poll(src) == 0  # an adopted server's log is followed from its end
    with first.open("a") as f:
        f.write("[t] WARNING token hf_abcdefgh in a line\nhalf a li")
    assert fwd.poll(src) == 1
    with first.open("a") as f:
        f.write("ne\n")
    assert fwd.poll(src) == 1
    first.write_text("after the copy-truncate\n")  # the size bound truncated it
    assert fwd.poll(src) == 1
    second = tmp_path / "server-2.log"
    second.write_text("a new launch\n")
    assert fwd.poll(Source(second, 12, ())) == 1
    assert fwd.poll(None) == 0  # the server is gone: nothing new in its last file
    assert lines_of(caplog) == [
        "[pid 11] [t] WARNING token <redacted> in a line",
        "[pid 11] half a line",
        "[pid 11] after the copy-truncate",
        "[pid 12] a new launch",
    ]
    assert next(r.levelno for r in caplog.records if r.name == "sglang") == logging.WARNING


def test_rate_and_length_are_bounded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "sglang")
    path = tmp_path / "server-1.log"
    path.write_text("")
    fwd = LogForwarder(lambda: None, max_lines_per_s=10)
    src = Source(path, 7, ())
    fwd.poll(src)
    path.write_text("".join(f"line {i}\n" for i in range(500)) + "x" * 10 * MAX_LINE_CHARS + "\n")
    assert fwd.poll(src) <= 11
    fwd._refilled -= 1.0  # a second later: the bound's tokens are back
    fwd.poll(src)
    said = lines_of(caplog)
    assert any("lines of the server's log not forwarded (over 10 lines/s)" in s for s in said)
    assert all(len(s) <= MAX_LINE_CHARS + 20 for s in said)


def test_stop_forwards_what_was_written_until_then(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "sglang")
    path = tmp_path / "server-1.log"
    path.write_text("")
    src = Source(path, 9, ())

    async def main() -> None:
        fwd = LogForwarder(lambda: src, poll_s=3600)
        fwd.start()
        while not fwd._started:  # its first poll: follows from the (empty) end
            await asyncio.sleep(0.01)
        path.write_text("Gracefully exiting... Remaining number of requests 0.\n")
        await fwd.stop()

    asyncio.run(main())
    assert lines_of(caplog) == ["[pid 9] Gracefully exiting... Remaining number of requests 0."]


def test_every_path_the_daemon_probes_is_kept_out_of_the_access_log() -> None:
    health = Path(__file__).parents[2] / "supervisor" / "observe" / "health.py"
    import re

    probed = set(re.findall(r'f"\{url\}(/[a-z_]+)"', health.read_text()))
    assert probed and probed <= set(PROBE_PATHS), probed - set(PROBE_PATHS)


def test_concurrent_polls_forward_each_line_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cancelled follower's poll may still run in its worker thread while ``stop``
    flushes in another: each line still reaches the journal once."""
    caplog.set_level(logging.INFO, "sglang")
    path = tmp_path / "server-1.log"
    path.write_text("")
    fwd = LogForwarder(lambda: None, max_lines_per_s=10**6)
    src = Source(path, 7, ())
    fwd.poll(src)  # followed from here
    done = threading.Event()

    def write() -> None:
        with path.open("a") as f:
            for i in range(3000):
                f.write(f"line {i}\n")
                f.flush()
        done.set()

    def poll() -> None:
        while not done.is_set():
            fwd.poll(src)

    threads = [threading.Thread(target=poll) for _ in range(6)] + [threading.Thread(target=write)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    fwd.poll(src)
    said = lines_of(caplog)
    assert len(said) == 3000 and len(set(said)) == 3000, (len(said), len(set(said)))


def test_a_launch_of_this_daemon_is_forwarded_from_its_first_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The first poll may come after the launch wrote its first lines (its arguments):
    they are forwarded all the same; only a log from before the daemon is skipped."""
    caplog.set_level(logging.INFO, "sglang")
    earlier = tmp_path / "server-1.log"
    earlier.write_text("an earlier daemon's launch\n")
    launch = tmp_path / "server-2.log"
    launch.write_text("server_args=ServerArgs(model_path='m')\n")
    fwd = LogForwarder(lambda: None, earlier=frozenset({earlier}))
    assert fwd.poll(Source(launch, 12, ())) == 1
    assert lines_of(caplog) == ["[pid 12] server_args=ServerArgs(model_path='m')"]


def test_secrets_are_hidden_across_the_line_cut_and_when_short(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A secret across MAX_LINE_CHARS kept its first part in the journal; a short one
    (under MIN_SECRET_CHARS) in SGLang's ServerArgs print was forwarded whole."""
    caplog.set_level(logging.INFO, "sglang")
    path = tmp_path / "server-1.log"
    path.write_text("")
    secret = "hf_abcdefghijklmnop"
    src = Source(path, 9, (secret, "k3y"))
    fwd = LogForwarder(lambda: None)
    fwd.poll(src)
    cut = "x" * (MAX_LINE_CHARS - 8) + secret + " after\n"
    args = "server_args=ServerArgs(model_path='m', api_key='k3y', admin_api_key=None, port=1)\n"
    with path.open("a") as f:
        f.write(cut + args)
    assert fwd.poll(src) == 2
    said = "\n".join(lines_of(caplog))
    assert secret[:8] not in said, said[-200:]
    assert "k3y" not in said and "api_key='<redacted>', admin_api_key=None" in said, said


def test_long_lines_cost_little_to_scrub(tmp_path: Path) -> None:
    """The forwarder's thread holds the GIL while it scrubs: a second's worth of 4,000
    character lines of letters before an ``=`` took 5 s (the URL pattern rescanned the
    run at every position), and a 100,000 character line 18 s when scrubbed whole."""
    path = tmp_path / "server-1.log"
    path.write_text("")
    src = Source(path, 9, ("hf_abcdefghijklmnop",))
    fwd = LogForwarder(lambda: None)
    fwd.poll(src)
    line = "a" * (MAX_LINE_CHARS - 1) + "="
    path.write_text((line + "\n") * 200)
    assert fwd.poll(src) == 200  # the bound: one second's worth
    fwd._refilled -= 1.0  # a second later
    with path.open("a") as f:
        f.write("b" * 100_000 + "=\n")
    # A guard against the quadratic scan (18 s before), not a timing goal: it takes
    # ~0.05 s, and the bound leaves a loaded machine a wide margin.
    began = time.monotonic()
    assert fwd.poll(src) == 1
    assert time.monotonic() - began < 6.0


def test_escapes_and_control_bytes_never_reach_the_journal_and_levels_come_from_the_field(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 27 §6: a server line's ANSI CSI and OSC sequences and NUL went to the journal
    raw (a line could paint a fake daemon record on a terminal; a NUL splits a journald
    record), and the word "ERROR" anywhere in a line's first 200 characters made it an
    error. The level is the level field's: uvicorn's ``ERROR:`` at the start, a level
    right after SGLang's ``[time]`` prefix, a traceback."""
    caplog.set_level(logging.INFO, "sglang")
    path = tmp_path / "server-1.log"
    path.write_text("")
    src = Source(path, 5, ())
    fwd = LogForwarder(lambda: None)
    fwd.poll(src)
    lines = {
        "[2026-12-01 10:00:00] Prefill batch\x1b[2K\x1b[1A\x1b[31m fake\x1b[0m": logging.INFO,
        "\x1b]0;owned title\x07title\x1b]8;;http://x\x1b\\link": logging.INFO,
        "nul\x00inside, C1 csi \x9b31m, bell \x07, tab\tkept": logging.INFO,
        '[2026-12-01 10:00:00] POST /generate "prompt: print ERROR and WARNING"': logging.INFO,
        "  File /srv/ERROR/x.py, line 3, in WARNING": logging.INFO,
        "ERROR:    Exception in ASGI application": logging.ERROR,
        "[2026-12-01 10:00:00 TP0] WARNING the model is large": logging.WARNING,
        "Traceback (most recent call last):": logging.ERROR,
    }
    with path.open("a", newline="") as f:
        f.write("".join(line + "\n" for line in lines))
    assert fwd.poll(src) == len(lines)
    got = [(r.getMessage(), r.levelno) for r in caplog.records if r.name == "sglang"]
    assert [level for _, level in got] == list(lines.values()), got
    for message, _ in got:
        assert not any((ord(c) < 0x20 and c != "\t") or 0x7F <= ord(c) <= 0x9F for c in message)
    said = [message for message, _ in got]
    assert said[0] == "[pid 5] [2026-12-01 10:00:00] Prefill batch fake"
    assert said[1] == "[pid 5] titlelink"
    assert said[2] == r"[pid 5] nul\x00inside, C1 csi \x9b31m, bell \x07, tab" + "\tkept"
