"""The page-cache warm-up before the stop (``sglang_supervisor.host.pagecache``): every file
read whole, a cancel or a deadline ending it, and a budget that leaves the hierarchical
cache its RAM."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from sglang_supervisor.host import pagecache
from sglang_supervisor.units import GB, GiB


def test_every_file_is_read_whole(tmp_path: Path) -> None:
    files = []
    for i in range(6):
        f = tmp_path / f"shard-{i}.safetensors"
        f.write_bytes(bytes([i]) * (pagecache.CHUNK + 1000 * i))
        files.append(f)
    got = pagecache.read(files, threading.Event(), time.monotonic() + 60)
    assert got.stopped is None and got.errors == []
    assert (got.files, got.read_bytes) == (6, sum(f.stat().st_size for f in files))
    assert pagecache.drop(files) == got.read_bytes


def test_a_cancel_or_the_deadline_ends_it(tmp_path: Path) -> None:
    f = tmp_path / "big.safetensors"
    f.write_bytes(b"\0" * (3 * pagecache.CHUNK))
    cancel = threading.Event()
    cancel.set()
    got = pagecache.read([f] * 4, cancel, time.monotonic() + 60)
    assert got.stopped == "cancelled" and got.read_bytes < 4 * f.stat().st_size
    late = pagecache.read([f], threading.Event(), time.monotonic() - 1)
    assert late.stopped == "its deadline passed (warmup_timeout_s)"
    missing = pagecache.read([tmp_path / "gone"], threading.Event(), time.monotonic() + 60)
    assert "gone" in missing.errors[0] and missing.files == 0


def test_the_budget_leaves_the_host_cache_its_ram() -> None:
    """Pages read before the stop must survive the new server pinning its host pool."""
    plain = pagecache.budget(100 * GB, "host", new_pool=0, freed=0)
    assert plain.bytes == 100 * GB - pagecache.WARMUP_MARGIN
    grows = pagecache.budget(100 * GB, "cgroup", new_pool=60 * GB, freed=20 * GB)
    assert grows.bytes == 60 * GB - pagecache.WARMUP_MARGIN
    assert "100.0 GB of RAM available (cgroup)" in grows.why
    assert "the hierarchical cache's 40.0 GB more" in grows.why
    shrinks = pagecache.budget(100 * GB, "host", new_pool=0, freed=50 * GB)
    assert shrinks.bytes == 100 * GB - pagecache.WARMUP_MARGIN  # never more than is free now
    assert pagecache.budget(4 * GiB, "host", 0, 0).bytes == 0
