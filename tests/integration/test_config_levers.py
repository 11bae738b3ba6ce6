"""The config file as the levers' desired state, through a real ``serve --simulate``
daemon: /status's ``drift``, a SIGHUP that re-reads ``[server.levers]``,
``sglang-supervisor reconcile`` (with and without drift, dry run), and
``levers_source = "config"`` (a SIGHUP reconciles; the config's levers win at start; an
invalid config is refused with the server untouched)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers import Daemon, wait_until

REPO = Path(__file__).resolve().parents[2]
LEVERS = {"model_path": "sim/llama", "tensor-parallel-size": 2, "mem_fraction_static": "0.85"}


def reconcile_cli(d: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return cli(d, "reconcile", *args)


def cli(d: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_supervisor_api.cli", *args, "--url", d.url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def edit_config(d: Daemon, old: str, new: str) -> None:
    text = d.config_path.read_text()
    assert old in text, text
    d.config_path.write_text(text.replace(old, new))


def sighup(d: Daemon) -> None:
    assert d.proc is not None
    d.proc.send_signal(signal.SIGHUP)


def drift(d: Daemon) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = d.status()["drift"]
    return entries


def operations(d: Daemon) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = d.client.get("/operations").json()["operations"]
    return ops


def test_drift_follows_api_changes_and_sighup_and_reconcile_restores_the_config(
    daemon_factory: type[Daemon],
) -> None:
    d = daemon_factory(gpus=2, levers=LEVERS).start()
    # The config spells tp as --tensor-parallel-size and the fraction as text: no drift.
    st = d.status()
    assert st["drift"] == [], st["drift"]
    assert st["levers_config"]["levers_source"] == "api"
    assert (
        st["levers_config"]["serving"] == f"the levers the server runs (pid {st['server']['pid']})"
    )

    r = d.apply({"mem_fraction_static": 0.8}, {"NCCL_DEBUG": "INFO"})
    assert r.json()["operation"]["state"] == "succeeded", r.text
    assert drift(d) == [
        {"lever": "mem_fraction_static", "config": 0.85, "serving": 0.8},
        {"lever": "env.NCCL_DEBUG", "config": None, "serving": "INFO"},
    ]

    # An edited config counts once the daemon re-reads it (SIGHUP); the server stays.
    pid = d.status()["server"]["pid"]
    edit_config(d, 'mem_fraction_static = "0.85"', "mem_fraction_static = 0.82")
    sighup(d)
    wait_until(
        lambda: {"lever": "mem_fraction_static", "config": 0.82, "serving": 0.8} in drift(d),
        10,
        0.05,
        "the drift with the edited config's value",
    )
    assert d.status()["server"]["pid"] == pid
    shown = cli(d, "status")
    assert "drift from the config" in shown.stdout, shown.stdout
    assert re.search(r"mem_fraction_static +0\.82 +0\.8\n", shown.stdout), shown.stdout

    # A dry run changes nothing.
    before_ops = len(operations(d))
    dry = reconcile_cli(d, "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "would change: " in dry.stdout and "env.NCCL_DEBUG" in dry.stdout, dry.stdout
    assert "mem_fraction_static 0.8 -> 0.82" in dry.stdout, dry.stdout
    st = d.status()
    assert st["server"]["pid"] == pid and st["levers"]["mem_fraction_static"] == 0.8
    assert len(drift(d)) == 2

    # With drift: one operation, the config's levers (and no env) serve, a new server.
    done = reconcile_cli(d)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "succeeded" in done.stdout, done.stdout
    st = d.status()
    assert st["levers"] == {"model_path": "sim/llama", "tp_size": 2, "mem_fraction_static": 0.82}
    assert st["env"] == {}
    assert st["drift"] == []
    assert st["server"]["pid"] != pid
    ops = operations(d)
    assert len(ops) == before_ops + 2  # the dry run, then the one reconcile
    assert ops[0]["kind"] == "apply" and ops[0]["state"] == "succeeded"
    assert ops[0]["phases"][0]["detail"].startswith("reconcile (POST /reconcile): the config's")
    assert st["levers_config"]["last_reconcile"]["operation"] == ops[0]["id"]

    # Without drift: succeeded, the same server, nothing restarted.
    pid = st["server"]["pid"]
    again = reconcile_cli(d)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"nothing changed: pid {pid} already serves" in operations(d)[0]["phases"][-1]["detail"]
    assert d.status()["server"]["pid"] == pid
    assert [p["name"] for p in operations(d)[0]["phases"]] == ["validate", "preflight", "commit"]


def test_reconcile_rereads_the_config_without_a_sighup_and_refuses_an_invalid_one(
    daemon_factory: type[Daemon],
) -> None:
    d = daemon_factory(gpus=2, levers=LEVERS).start()
    pid = d.status()["server"]["pid"]
    # ?dry_run= and the body's dry_run contradicting: refused, as POST /levers does.
    for query, body in (("false", True), ("true", False)):
        r = d.client.post("/reconcile", params={"dry_run": query}, json={"dry_run": body})
        assert r.status_code == 422 and "contradicts" in r.text, r.text
    assert not [op for op in operations(d) if op["id"] != d.status()["last_operation"]["id"]]
    edit_config(d, 'mem_fraction_static = "0.85"', 'mem_fraction_static = "plenty"')
    r = d.client.post("/reconcile", json={})
    assert r.status_code == 422, r.text
    problems = r.json()["detail"]["problems"]
    assert [p["lever"] for p in problems] == ["mem_fraction_static"], problems
    st = d.status()
    assert st["server"]["pid"] == pid and st["levers"]["mem_fraction_static"] == 0.85
    # The drift names it, and why the config cannot be applied.
    assert [p["lever"] for p in st["levers_config"]["problems"]] == ["mem_fraction_static"]
    assert st["levers_config"]["last_reconcile"]["outcome"] == "refused"

    edit_config(d, 'mem_fraction_static = "plenty"', "mem_fraction_static = 0.8")
    r = d.client.post("/reconcile", params={"wait": "true"}, json={})
    assert r.status_code == 200 and r.json()["operation"]["state"] == "succeeded", r.text
    st = d.status()
    assert st["levers"]["mem_fraction_static"] == 0.8 and st["server"]["pid"] != pid
    # The refusal's warning went with the accepted reconcile.
    assert not [w for w in st["warnings"] if "reconcile" in w], st["warnings"]


def test_levers_source_config_sighup_reconciles_and_refuses_an_invalid_edit(
    daemon_factory: type[Daemon],
) -> None:
    d = daemon_factory(gpus=2, levers=LEVERS, extra={"server": {"levers_source": "config"}})
    d.start()
    pid = d.status()["server"]["pid"]

    # An invalid lever: refused, the server untouched, the reason in /status.
    edit_config(d, 'mem_fraction_static = "0.85"', "mem_fraction_static = 0.8\nno_such_flag = 1")
    sighup(d)
    st = wait_until(
        lambda: (s := d.status())["levers_config"]["last_reconcile"] and s,
        10,
        0.05,
        "the SIGHUP's reconcile",
    )
    last = st["levers_config"]["last_reconcile"]
    assert last["trigger"] == "SIGHUP" and last["outcome"] == "refused", last
    assert [p["lever"] for p in last["problems"]] == ["no_such_flag"]
    shown = [w for w in st["warnings"] if "no_such_flag" in w]
    assert shown and "the server was untouched" in shown[0], st["warnings"]
    assert st["server"]["pid"] == pid and st["levers"]["mem_fraction_static"] == 0.85
    assert st["state"] == "ready" and st["operation"] is None

    # Fixed: the SIGHUP runs the edited levers.
    edit_config(d, "\nno_such_flag = 1", "")
    sighup(d)
    st = wait_until(
        lambda: (
            (s := d.status())["levers"]["mem_fraction_static"] == 0.8
            and s["state"] == "ready"
            and s["operation"] is None
            and s
        ),
        60,
        0.1,
        "the server on the edited levers",
    )
    assert st["server"]["pid"] != pid
    assert st["drift"] == []
    assert st["levers_config"]["last_reconcile"]["outcome"] == "accepted"
    assert not [w for w in st["warnings"] if "reconcile" in w], st["warnings"]


def test_levers_source_config_wins_over_the_last_applied_at_daemon_start(
    daemon_factory: type[Daemon],
) -> None:
    d = daemon_factory(gpus=2, levers=LEVERS, extra={"server": {"levers_source": "config"}})
    d.start()
    r = d.apply({"mem_fraction_static": 0.8})
    assert r.json()["operation"]["state"] == "succeeded", r.text
    assert d.stop() == 0
    # With "api" the last applied set would start again (state.json); "config" owns it.
    d.start()
    st = d.status()
    assert st["levers"]["mem_fraction_static"] == 0.85, st["levers"]
    assert st["drift"] == []


def test_a_sighup_during_start_up_starts_no_operation_and_the_start_up_takes_the_edit(
    daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    slow = tmp_path / "slow-python"  # asking it for SGLang takes 6 s: start-up is slow
    slow.write_text("#!/bin/sh\nexec sleep 6\n")
    slow.chmod(0o755)
    d = daemon_factory(
        gpus=2, levers=LEVERS, extra={"server": {"levers_source": "config", "python": str(slow)}}
    )
    d.spawn()
    wait_until(lambda: (s := d.status_or_none()) and s["loading"], 30, 0.05, "start-up loading")
    edit_config(d, 'mem_fraction_static = "0.85"', "mem_fraction_static = 0.8")
    sighup(d)
    st = d.wait_state("ready", 60)
    # One operation: the start-up's, with the edited levers; no apply ran beside it (nor
    # was one refused for a daemon that had not found its GPUs yet).
    assert [op["kind"] for op in operations(d)] == ["start"]
    assert st["levers"]["mem_fraction_static"] == 0.8 and st["drift"] == []
    assert st["levers_config"]["last_reconcile"] is None
    assert not [w for w in st["warnings"] if "reconcile" in w], st["warnings"]
    assert "reconcile (SIGHUP) not run: the daemon is still starting" in d.log()
