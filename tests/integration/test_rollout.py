"""``sglang-supervisor rollout`` across daemons (without a router): every replica
validates first, then one at a time; the first rollback stops the rollout. Canaries
first: a canary that regresses stops the rollout and the canaries end on their old
levers."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import Daemon, wait_until
from tests.integration.test_cli import _env

REPO = Path(__file__).resolve().parents[2]


def rollout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_supervisor_api.cli", "rollout", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=_env(),
        check=False,
    )


def fraction(d: Daemon) -> float:
    return float(d.status()["levers"]["mem_fraction_static"])


def test_a_refusal_on_any_replica_touches_none(daemon_factory: type[Daemon]) -> None:
    a, b = daemon_factory(gpus=2).start(), daemon_factory(gpus=2).start()
    pids = [a.status()["server"]["pid"], b.status()["server"]["pid"]]
    r = rollout("--daemon", a.url, "--daemon", b.url, "--set", "tp_size=3")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "refused" in r.stdout
    assert [a.status()["server"]["pid"], b.status()["server"]["pid"]] == pids


def test_one_at_a_time_and_the_first_rollback_stops_it(
    daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    a, b = daemon_factory(gpus=2).start(), daemon_factory(gpus=2).start()
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(f'daemons = ["{a.url}", "{b.url}"]\n')
    r = rollout("--fleet", str(fleet), "--set", "mem_fraction_static=0.84", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    outcomes = json.loads(r.stdout)
    assert [o["outcome"] for o in outcomes] == ["succeeded", "succeeded"]
    assert "no router configured" in outcomes[0]["detail"]
    assert (fraction(a), fraction(b)) == (0.84, 0.84)

    # The first replica's new server fails to start: it rolls back, the second is untouched.
    b_pid = b.status()["server"]["pid"]
    r = rollout(
        "--daemon", a.url, "--daemon", b.url,
        "--set", "mem_fraction_static=0.83", "--env", "SGLANG_SIM_FAULTS=crash_on_start",
    )  # fmt: skip
    assert r.returncode == 3, r.stdout + r.stderr
    table = r.stdout.splitlines()[-2:]
    assert table[0].startswith(a.url) and " rolled_back " in table[0]
    assert table[1].startswith(b.url) and " not started " in table[1]
    assert (fraction(a), fraction(b)) == (0.84, 0.84)
    assert b.status()["server"]["pid"] == b_pid


#: Each replica's own open-loop load (the simulator's): what the canaries are judged by.
LOAD = "rate=50,avg_tokens=1000,out_tokens=200,seed=1"


def started(factory: type[Daemon], n: int, **kw: object) -> list[Daemon]:
    ds = [factory(gpus=2, **kw) for _ in range(n)]  # type: ignore[arg-type]
    for d in ds:
        d.spawn()
    return [d.wait_started() for d in ds]


def loaded(d: Daemon, n: int) -> bool:
    arrivals = d.client.get("/history").json()["arrivals_per_s"]
    return sum(v is not None for v in arrivals) >= n


def test_canaries_that_regress_stop_the_rollout_on_their_old_levers(
    daemon_factory: type[Daemon],
) -> None:
    a, b, c = started(
        daemon_factory,
        3,
        timeouts={"effect_window_s": 6.0},
        extra={"server": {"env": {"SGLANG_SIM_LOAD": LOAD}}},
    )
    for d in (a, b, c):
        wait_until(lambda d=d: loaded(d, 5), 60, 0.5, "a window of each replica's load")
    pids = [d.status()["server"]["pid"] for d in (a, b, c)]
    # Capping the decode batch at 8 costs throughput under 50 requests a second.
    r = rollout(
        "--daemon", a.url, "--daemon", b.url, "--daemon", c.url,
        "--canary", "2", "--max-unavailable", "2", "--set", "max_running_requests=8",
        "--json",
    )  # fmt: skip
    assert r.returncode == 3, r.stdout + r.stderr
    outcomes = json.loads(r.stdout)
    assert [o["outcome"] for o in outcomes] == ["rolled_back", "rolled_back", "not started"]
    assert [o["canary"] for o in outcomes] == [True, True, False]
    for o in outcomes[:2]:
        assert o["effect"]["verdict"] == "worse" and "throughput" in o["detail"], o
    assert "the canaries did not prove the change no worse" in outcomes[2]["detail"]
    # The canaries serve their old levers again; the third was never touched.
    assert all("max_running_requests" not in d.status()["levers"] for d in (a, b, c))
    assert c.status()["server"]["pid"] == pids[2]
    assert all(d.status()["server"]["pid"] != p for d, p in zip((a, b), pids[:2], strict=True))


def test_a_canary_whose_effect_is_not_proven_is_put_back(daemon_factory: type[Daemon]) -> None:
    """No load to judge by (or no readings yet): the change is not proven no worse, so the
    canary that committed goes back to its old levers and the rest are not started."""
    a, b = started(daemon_factory, 2, timeouts={"effect_window_s": 2.0})
    b_pid = b.status()["server"]["pid"]
    r = rollout(
        "--daemon", a.url, "--daemon", b.url, "--canary", "1",
        "--set", "mem_fraction_static=0.84",
    )  # fmt: skip
    assert r.returncode == 3, r.stdout + r.stderr
    table = r.stdout.splitlines()[-2:]
    assert table[0].startswith(f"{a.url} (canary)") and " reverted " in table[0], table
    assert re.search(r"not proven no worse \((no load|not measured)\)", table[0]), table[0]
    assert table[1].startswith(b.url) and " not started " in table[1]
    assert fraction(a) == 0.85 and fraction(b) == 0.85
    assert b.status()["server"]["pid"] == b_pid
