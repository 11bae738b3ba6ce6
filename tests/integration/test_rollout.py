"""``sglang-supervisor rollout`` across two daemons (without a router): every replica
validates first, then one at a time; the first rollback stops the rollout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import Daemon
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
