"""A change of levers on one server with no router: what a client streaming through it sees.

SGLang 0.5.23's launcher drains on SIGTERM — it keeps serving until no request is left,
with no deadline of its own (tokenizer_manager.py:2455 installs the handler, :4066-4070
sets ``gracefully_exit``, :3508-3548 ``sigterm_watchdog`` waits for the requests, then
ends its workers with kill_process_tree, utils/common.py:2507) — while its scheduler and
detokenizer have no SIGTERM handler (scheduler.py:6257-6300, detokenizer_manager.py
:545-569) and die of one at once, which makes the launcher's SubprocessWatchdog
(utils/watchdog.py:211-222) kill the whole tree. The simulated server behaves the same
(supervisor/sim/lifecycle.py, children.py). So the supervisor's stop sends the first
SIGTERM to the launcher alone and waits ``stop_grace_s`` for it (supervisor/host/teardown.py):
a generation shorter than the grace ends whole; a longer one is cut at the grace.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.helpers import Daemon, tagged_processes, wait_until

#: 20 tokens/s: a 40-token answer takes 2 s, a 400-token one 20 s.
TOKENS_PER_S = 20


@dataclass
class Stream:
    """One streamed /v1/completions request read to its end in a thread."""

    url: str
    max_tokens: int
    tokens: int = 0
    finish_reason: str | None = None
    done: bool = False
    error: str = ""
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> Stream:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        wait_until(lambda: self.tokens > 0 or self.error, 20, 0.01, "the first token")
        assert not self.error, self.error
        return self

    def join(self, timeout: float) -> Stream:
        assert self._thread is not None
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the stream neither ended nor broke off"
        return self

    def _run(self) -> None:
        body = {"model": "default", "prompt": "hello " * 8, "max_tokens": self.max_tokens}
        try:
            with (
                httpx.Client(timeout=60, trust_env=False) as c,
                c.stream("POST", f"{self.url}/v1/completions", json={**body, "stream": True}) as r,
            ):
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[len("data: ") :]
                    if data == "[DONE]":
                        self.done = True
                        break
                    choice: dict[str, Any] = json.loads(data)["choices"][0]
                    self.tokens += 1 if choice.get("text") else 0
                    self.finish_reason = choice.get("finish_reason") or self.finish_reason
        except httpx.HTTPError as exc:
            self.error = f"{type(exc).__name__}: {exc}"


def _daemon(factory: type[Daemon], grace_s: float) -> Daemon:
    return factory(
        gpus=2,
        timeouts={"stop_grace_s": grace_s},
        extra={"server": {"env": {"SGLANG_SIM_TOKENS_PER_S": str(TOKENS_PER_S)}}},
    ).start()


def _stop_phase(op: dict[str, Any]) -> dict[str, Any]:
    return next(p for p in op["phases"] if p["name"] == "stop")


def test_an_apply_lets_a_stream_in_flight_finish_within_the_grace(
    daemon_factory: type[Daemon],
) -> None:
    """No router, no drain asked for: the apply's stop itself lets the generation in
    flight end whole (every token, finish_reason, [DONE]), because SGLang drains on the
    launcher's SIGTERM and nothing else is signalled while it does."""
    d = _daemon(daemon_factory, grace_s=20.0)
    old_pid = d.status()["server"]["pid"]
    stream = Stream(f"http://127.0.0.1:{d.server_port}", max_tokens=40).start()
    r = d.apply({"mem_fraction_static": 0.8})
    op = r.json()["operation"]
    assert op["state"] == "succeeded", op
    stream.join(30)
    assert (stream.tokens, stream.finish_reason, stream.done) == (40, "length", True), stream
    assert d.status()["server"]["pid"] != old_pid
    stop = _stop_phase(op)
    assert f"launcher (pid {old_pid}) drained and exited in" in stop["detail"], stop
    assert "SIGKILL" not in stop["detail"], stop


def test_a_stream_longer_than_the_grace_is_cut_by_sigkill(
    daemon_factory: type[Daemon],
) -> None:
    """The grace bounds the drain: a generation that would run past it is cut (some
    tokens, no finish_reason, no [DONE]) and the launcher, still draining, is SIGKILLed."""
    d = _daemon(daemon_factory, grace_s=1.0)
    old_pid = d.status()["server"]["pid"]
    stream = Stream(f"http://127.0.0.1:{d.server_port}", max_tokens=400).start()
    op = d.apply({"mem_fraction_static": 0.8}).json()["operation"]
    assert op["state"] == "succeeded", op
    stream.join(30)
    assert 0 < stream.tokens < 400 and stream.finish_reason is None and not stream.done, stream
    stop = _stop_phase(op)
    assert f"launcher (pid {old_pid}) still running after the 1s grace" in stop["detail"], stop
    assert "SIGKILL" in stop["detail"], stop


def test_detached_ranks_ignoring_sigterm_are_sigkilled_and_gpus_released(
    daemon_factory: type[Daemon],
) -> None:
    """Ranks that left the launcher's session (setsid) and ignore SIGTERM, under a
    launcher that ignores it too: found by their launch tag, SIGTERMed once the grace is
    over, SIGKILLed after it, and every simulated GPU verified released."""
    d = daemon_factory(gpus=2, timeouts={"stop_grace_s": 0.5}).start()
    faults = {"SGLANG_SIM_FAULTS": "detach_ranks,ignore_sigterm"}
    assert d.apply(env=faults).json()["operation"]["state"] == "succeeded"
    leader = d.status()["server"]["pid"]
    ranks = [p.pid for p in tagged_processes(d.instance) if p.pid != leader]
    assert ranks and all(os.getsid(p) != leader for p in ranks), "ranks did not detach"
    op = d.client.post("/stop", params={"wait": "true"}).json()["operation"]
    assert op["state"] == "succeeded", op
    stop = _stop_phase(op)
    assert "still running after the 0.5s grace" in stop["detail"], stop
    assert f"{len(ranks) + 1} members still running got SIGTERM" in stop["detail"], stop
    assert f"SIGKILL to {sorted([leader, *ranks])}" in stop["detail"], stop
    s = d.status()
    assert s["state"] == "stopped"
    assert all(g["memory_used_bytes"] == 0 and g["processes"] == [] for g in s["gpus"]), s
    assert tagged_processes(d.instance) == []
