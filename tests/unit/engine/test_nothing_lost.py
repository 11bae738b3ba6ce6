"""Issue 20 §4: persisted levers that stop fitting SGLang are never lost.

Before: the daemon logged "not using them", started the configured levers and its next
two saves overwrote both ``state.json`` and the valid ``state.prev.json``: the last-good
set was gone from disk. Now the previous copy is tried, the misfits are kept in
``state.rejected.json``, and /status names that file and the levers to fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_supervisor import diskspace
from sglang_supervisor.operations import FAILED
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.store import REJECTED_FILE, PersistedState, Store
from tests.unit.engine.common import apply
from tests.unit.fakes import INITIAL_LEVERS, Behaviour, make_rig, run

GOOD = LeverSet({**INITIAL_LEVERS, "mem_fraction_static": 0.7})
STALE = LeverSet({**INITIAL_LEVERS, "flag_removed_in_upgrade": 1})


def test_the_previous_copy_is_used_when_the_current_levers_no_longer_fit(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path)
    store.save(PersistedState(levers=GOOD, last_good=GOOD))  # becomes state.prev.json
    store.save(PersistedState(levers=STALE, last_good=STALE))
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        status = await rig.sup.status()
        assert status["levers"] == dict(GOOD.levers)  # not the configured levers
        argv = rig.procs.spawns[0].argv
        assert argv[argv.index("--mem-fraction-static") + 1] == "0.7"
        warning = next(w for w in status["warnings"] if "do not fit SGLang" in w)
        assert "fix flag_removed_in_upgrade" in warning
        assert str(tmp_path / REJECTED_FILE) in warning
        assert "state.prev.json" in warning
        await rig.sup.shutdown()

    run(main)
    assert Store(tmp_path).load().last_good == GOOD
    kept = json.loads((tmp_path / REJECTED_FILE).read_text())["data"]["sets"]
    assert kept["state.json last_good"]["levers"]["levers"]["flag_removed_in_upgrade"] == 1
    assert kept["state.json last_good"]["problems"][0]["lever"] == "flag_removed_in_upgrade"


def test_misfits_everywhere_start_the_configured_levers_and_stay_on_disk(
    tmp_path: Path,
) -> None:
    Store(tmp_path).save(PersistedState(levers=STALE, last_good=STALE))
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        status = await rig.sup.status()
        assert status["levers"] == dict(rig.settings.server.levers)
        assert any(
            "starting the configured levers" in w and REJECTED_FILE in w for w in status["warnings"]
        )
        await rig.sup.shutdown()

    run(main)
    # state.json and state.prev.json were both rewritten since; the set is still on disk.
    for name in ("state.json", "state.prev.json"):
        assert "flag_removed_in_upgrade" not in (tmp_path / name).read_text()
    assert "flag_removed_in_upgrade" in (tmp_path / REJECTED_FILE).read_text()


def test_a_start_that_fails_on_a_full_disk_names_the_disk_and_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: "exited with code 1" and an empty log tail. Now the disk (its mount
    point) and the log's path are named, with what to do."""
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        monkeypatch.setattr(diskspace, "free_bytes", lambda path: 4096)  # the disk fills up
        rig.procs.plan(Behaviour(exit_on_start=1), Behaviour(exit_on_start=1))
        op = await apply(rig, {"mem_fraction_static": 0.9})
        assert op.state == FAILED
        error = op.error or ""
        log_path = rig.procs.handles[1].log_path
        assert f"the disk holding {log_path}" in error
        assert f"mounted at {diskspace.mount_point(log_path)}" in error
        assert "is full: 4096 bytes free; free space there" in error
        await rig.sup.shutdown()

    run(main)
