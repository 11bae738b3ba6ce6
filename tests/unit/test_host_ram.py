"""Host RAM for the hierarchical cache, bounded by the cgroup as SGLang bounds it
(sglang/srt/mem_cache/host_memory.py:136-162): limit − (usage − file page cache), the
least over the cgroup and its ancestors."""

from __future__ import annotations

from pathlib import Path

from sglang_supervisor.planner.hicache import cgroup_headroom_bytes

GiB = 1 << 30


def _cgroup(root: Path, rel: str, limit: str, usage: int, cache: int) -> None:
    d = root / rel
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.max").write_text(limit + "\n")
    (d / "memory.current").write_text(f"{usage}\n")
    (d / "memory.stat").write_text(f"anon {usage - cache}\nactive_file {cache}\ninactive_file 0\n")


def _proc(tmp: Path, rel: str) -> Path:
    proc = tmp / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self/cgroup").write_text(f"0::/{rel}\n")
    return proc


def test_the_tightest_limit_up_the_hierarchy_counts(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _cgroup(root, "system.slice", str(100 * GiB), 90 * GiB, 20 * GiB)  # 30 GiB left
    _cgroup(root, "system.slice/sglang.service", str(64 * GiB), 40 * GiB, 8 * GiB)  # 32 left
    got = cgroup_headroom_bytes(_proc(tmp_path, "system.slice/sglang.service"), root)
    assert got == 30 * GiB


def test_no_limit_means_no_bound(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _cgroup(root, "user.slice", "max", 10 * GiB, 0)
    assert cgroup_headroom_bytes(_proc(tmp_path, "user.slice"), root) is None
