"""The simulated server charges the hierarchical cache's pinning at start and its
unpinning at stop, per GiB of the node's host pool, so a rehearsal shows what a large host
cache costs (issue 26 §2; the H200 figures by default, ``planner.stopcost``; here a rate
the test sets, ``SGLANG_SIM_PIN_S_PER_GIB`` / ``SGLANG_SIM_UNPIN_S_PER_GIB``). While
unpinning, a rank's GPU memory stays held after its process is gone, as a real rank's
exit holds it until the kernel has unpinned (``mem_cache/pool_host/base.py:283-300``,
SGLang 0.5.23)."""

from __future__ import annotations

import signal
import time

from sglang_supervisor.sim.gpus import read_registry
from sglang_supervisor.units import GB, GiB
from tests.integration.test_sim_server import Sims, sims, wait_until

__all__ = ["sims"]

RATE = 0.1  # s per GiB: 2 ranks × 8 GB = 14.9 GiB -> 1.5 s each way


def test_pinning_at_start_and_unpinning_at_stop_take_their_time(sims: Sims) -> None:
    rate = {"SGLANG_SIM_PIN_S_PER_GIB": str(RATE), "SGLANG_SIM_UNPIN_S_PER_GIB": str(RATE)}
    flags = ("--enable-hierarchical-cache", "--hicache-size", "8")
    sim = sims.start(*flags, env=rate)
    wait_until(lambda: "(simulated: pinning" in sim.log_text(), 20, "the pinning to begin")
    pinning = time.monotonic()
    assert sim.status("/health") == 503  # still starting: the pool is being pinned
    sim.wait_ready()
    took = time.monotonic() - pinning
    pinned_gib = sim.get_json("/server_info")["hicache_size"] * GB * 2 / GiB
    pin_s = RATE * pinned_gib
    assert f"takes {pin_s:.1f} s at {RATE:g} s per GiB" in sim.log_text()
    assert took >= pin_s - 0.05  # ready only once it is pinned
    held = sims.used_mib()[:2]
    assert all(held)

    asked = time.time()
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.exited(15) == 0
    # Every process is gone, yet the GPUs are not free until the pool is unpinned: each
    # rank's memory is held for the unpinning from its SIGTERM on.
    assert not sims.members()
    entries = read_registry(sims.registry)
    assert len(entries) == 2
    for reg in entries:
        assert reg.held_until is not None and reg.held_until >= asked + RATE * pinned_gib
    if time.time() < min(r.held_until or 0 for r in entries) - 0.05:
        assert sims.used_mib()[:2] == held
    wait_until(lambda: sims.used_mib()[:2] == [0, 0], 10, "the unpinned GPUs to be free")
    assert "unpinning the host pool" in sim.log_text()
