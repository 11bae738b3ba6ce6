"""The simulated server under traffic, as SGLang 0.5.23 behaves: streamed generations in
its wire formats, serving on through a SIGTERM, streams cut by a SIGKILL, uvicorn's
listen backlog, SGLang's metric labels."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_sim_server import Sim, Sims, sims, wait_until

__all__ = ["sims"]  # the fixture


def stream(sim: Sim, path: str, body: dict[str, Any], into: list[str] | None = None) -> list[str]:
    """The ``data:`` payloads of one streamed answer, in order (``into`` fills as they come).
    A cut stream ends early, without ``[DONE]``."""
    events = [] if into is None else into
    try:
        with httpx.stream("POST", sim.url(path), json=body, timeout=30) as r:
            assert r.status_code == 200, r.read()
            assert r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[len("data: ") :])
    except httpx.TransportError:
        pass  # the server went away mid-stream
    return events


def test_generate_streams_cumulative_text_then_done(sims: Sims) -> None:
    sim = sims.start(env={"SGLANG_SIM_TOKENS_PER_S": "200"})
    sim.wait_ready()
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 3}, "stream": True}
    events = stream(sim, "/generate", body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    # SGLang streams the text so far (incremental_streaming_output is off by default).
    assert [c["text"] for c in chunks] == ["sim", "sim sim", "sim sim sim"]
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None, None]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert chunks[-1]["meta_info"]["completion_tokens"] == 3


def test_openai_completions_and_chat_stream_and_not(sims: Sims) -> None:
    sim = sims.start("--served-model-name", "sim-70b", env={"SGLANG_SIM_TOKENS_PER_S": "200"})
    sim.wait_ready()
    body: dict[str, Any] = {"model": "sim-70b", "prompt": "hi", "max_tokens": 2, "stream": True}
    events = stream(sim, "/v1/completions", body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert "".join(c["choices"][0]["text"] for c in chunks) == "sim sim"
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, "length"]

    chat: dict[str, Any] = {
        "model": "sim-70b",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = stream(sim, "/v1/chat/completions", chat)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"]["content"] or "" for c in chunks[:-1] if c["choices"])
    assert text == "sim sim"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2

    chat["stream"] = False
    r = httpx.post(sim.url("/v1/chat/completions"), json=chat, timeout=30)
    assert r.status_code == 200
    answer = r.json()
    assert answer["object"] == "chat.completion" and answer["model"] == "sim-70b"
    assert answer["usage"]["completion_tokens"] == 2
    assert answer["metadata"] == {"weight_version": "default"}
    assert answer["choices"][0]["message"] == {
        "role": "assistant",
        "content": "sim sim",
        "reasoning_content": None,
    }
    bad = httpx.post(sim.url("/v1/chat/completions"), json={"messages": []}, timeout=30)
    assert bad.status_code == 400 and bad.json()["object"] == "error"


def test_sigterm_keeps_serving_until_the_streams_end(sims: Sims) -> None:
    sim = sims.start(env={"SGLANG_SIM_TOKENS_PER_S": "50"})
    sim.wait_ready()
    body = {"text": "a long one", "sampling_params": {"max_new_tokens": 100}, "stream": True}
    first: list[str] = []
    reader = threading.Thread(target=stream, args=(sim, "/generate", body, first))
    reader.start()
    try:
        wait_until(lambda: first, 10, "the first token")
        os.kill(sim.pid, signal.SIGTERM)
        wait_until(lambda: "draining" in sim.log_text(), 10, "the drain to begin")
        # Still accepting: a stream started after the signal is served to its end.
        late = stream(sim, "/generate", {**body, "sampling_params": {"max_new_tokens": 5}})
        assert sim.proc.poll() is None
    finally:
        reader.join(timeout=30)
    assert late[-1] == "[DONE]" and len(late) == 6
    assert first[-1] == "[DONE]" and len(first) == 101
    assert sim.exited(15) == 0
    assert sims.members() == []


def test_sigkill_cuts_a_stream_mid_way(sims: Sims) -> None:
    sim = sims.start(env={"SGLANG_SIM_TOKENS_PER_S": "50"})
    sim.wait_ready()
    body = {"text": "cut", "sampling_params": {"max_new_tokens": 200}, "stream": True}
    events: list[str] = []
    reader = threading.Thread(target=stream, args=(sim, "/generate", body, events))
    reader.start()
    wait_until(lambda: len(events) >= 3, 10, "a few tokens")
    os.killpg(sim.pid, signal.SIGKILL)
    reader.join(timeout=30)
    assert not reader.is_alive()
    assert "[DONE]" not in events and 3 <= len(events) < 200


def test_listen_backlog_health_and_info_endpoints(sims: Sims) -> None:
    sim = sims.start("--served-model-name", "sim-70b")
    sim.wait_ready()
    ss = subprocess.run(
        ["ss", "-Hltn", f"sport = :{sim.port}"], capture_output=True, text=True, check=True
    )
    # A listening socket's Send-Q is its backlog: uvicorn's 2048 (capped by somaxconn).
    with open("/proc/sys/net/core/somaxconn") as f:
        somaxconn = int(f.read())
    assert int(ss.stdout.split()[2]) == min(2048, somaxconn), ss.stdout
    assert sim.get_json("/server_info") == sim.get_json("/get_server_info")
    info = sim.get_json("/model_info")
    assert info["served_model_name"] == "sim-70b" and info["is_generation"] is True
    assert sim.get_json("/get_model_info") == info
    text = httpx.get(sim.url("/metrics"), timeout=5).text
    labels = {s.name: s.labels for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert labels["sglang:num_running_reqs"] == {
        "model_name": "sim-70b",
        "engine_type": "unified",
        "tp_rank": "0",
        "pp_rank": "0",
        "moe_ep_rank": "0",
    }
    assert labels["sglang:prompt_tokens_total"] == {
        "model_name": "sim-70b",
        "engine_type": "unified",
    }


def test_the_synthetic_load_begins_at_the_first_health_generate_answer(sims: Sims) -> None:
    """Its clients, as a router's, send work only to a server seen healthy: whatever the
    load breaks (a prefill out of memory) comes after the launcher's first
    /health_generate 200, never before it (issue 27 §4: an apply's prefill OOM came
    during the start or within probation, by the machine's load)."""
    sim = sims.start(env={"SGLANG_SIM_LOAD": "rate=500,avg_tokens=200,seed=1"})
    wait_until(lambda: sim.status("/health") == 200, 20, what="ready (/health answers 200)")
    # Five turns of the server's 0.1 s loop, 500 arrivals a second: none may come yet.
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        m = sim.metrics()
        assert m["sglang:num_running_reqs"] + m["sglang:num_queue_reqs"] == 0, m
        assert m["sglang:prompt_tokens_total"] == 0, m
    assert sim.status("/health_generate") == 200
    wait_until(
        lambda: sim.metrics()["sglang:prompt_tokens_total"] > 0, 10, what="the load to begin"
    )
