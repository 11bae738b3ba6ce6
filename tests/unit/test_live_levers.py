"""Which levers SGLang changes on a running server, read from its own source, and the path
a change takes (``sglang_supervisor.sglang.live``): live, a weights update, or a restart."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from sglang_supervisor.sglang import schema_probe
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.sglang.live import LiveSet, choose, lora_adapters
from sglang_supervisor.sglang.schema import FlagSchema, load_bundled
from tests.inprocess import api_client
from tests.sglang_env import SGLANG_PYTHON, needs_sglang
from tests.unit.fakes import run

SCHEMA = load_bundled()
LIVE = LiveSet.of(SCHEMA)
BASE = LeverSet({"model_path": "/models/a", "tp_size": 2})


def _sglang_dir() -> Path:
    """The installed SGLang's package directory, found without importing it."""
    code = (
        "import importlib.util, os; "
        "print(os.path.dirname(importlib.util.find_spec('sglang').origin))"
    )
    out = subprocess.run([SGLANG_PYTHON, "-c", code], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


@pytest.mark.parametrize("_", [pytest.param(None, marks=needs_sglang())])
def test_the_bundled_live_set_is_what_sglang_0_5_23s_source_says(_: None) -> None:
    """The bundled data is SGLang's own answer: read again from its source files
    (internal_state.py's ``_update_handlers``, io_struct.py's request classes, the routes of
    http_server.py) it is the same, key for key."""
    found = schema_probe.live_levers(str(_sglang_dir()), set(SCHEMA.flags))
    assert found == SCHEMA.live
    assert sorted(found["set_internal_state"]["levers"]) == [
        "pp_max_micro_batch_size",
        "speculative_accept_threshold_acc",
        "speculative_accept_threshold_single",
    ]
    assert sorted(found["configure_logging"]["levers"]) == [
        "crash_dump_folder",
        "log_level",
        "log_requests",
        "log_requests_format",
        "log_requests_level",
    ]
    assert found["hicache_storage"]["levers"]["hicache_storage_backend_extra_config"] == (
        "hicache_storage_backend_extra_config_json"
    )
    assert found["lora"]["levers"] == {"lora_paths": "lora_path"}
    weights = sorted(found["update_weights"]["levers"])
    assert weights == ["load_format", "model_path", "weight_version"]


def _fake_sglang(tmp: Path, *, handlers: list[str], routes: list[str]) -> Path:
    """A source tree shaped like SGLang's, for a version that is not installed."""
    root = tmp / "sglang"
    (root / "srt/managers/scheduler_components").mkdir(parents=True)
    (root / "srt/entrypoints").mkdir(parents=True)
    keys = "".join(f'            "{h}": _UpdateHandler(a, b),\n' for h in handlers)
    (root / "srt/managers/scheduler_components/internal_state.py").write_text(
        "class SchedulerInternalStateController:\n"
        "    def _update_handlers(self):\n"
        f"        return {{\n{keys}        }}\n"
    )
    (root / "srt/managers/io_struct.py").write_text(
        textwrap.dedent(
            """
            class ConfigureLoggingReq(BaseReq, kw_only=True):
                log_requests: Optional[bool] = None
                not_a_flag: Optional[int] = None
            """
        )
    )
    decorators = "".join(
        f'@app.api_route("{path}", methods=["{method}"])\nasync def f{i}(): ...\n'
        for i, (method, path) in enumerate(r.split(" ", 1) for r in routes)
    )
    (root / "srt/entrypoints/http_server.py").write_text(decorators)
    return root


def test_a_new_sglang_versions_live_set_is_found_the_same_way(tmp_path: Path) -> None:
    """No list typed by hand: a handler a later SGLang adds is live (when it is a launch
    flag), a mechanism whose route it dropped is not, and the note says which."""
    root = _fake_sglang(
        tmp_path,
        handlers=["pp_max_micro_batch_size", "schedule_conservativeness", "dspark_x"],
        routes=["POST /set_internal_state", "POST /configure_logging"],
    )
    found = schema_probe.live_levers(str(root), set(SCHEMA.flags))
    assert sorted(found["set_internal_state"]["levers"]) == [
        "pp_max_micro_batch_size",
        "schedule_conservativeness",  # a launch flag; dspark_x is not one
    ]
    assert found["configure_logging"]["levers"] == {"log_requests": "log_requests"}
    assert "hicache_storage" not in found and "update_weights" not in found
    assert any("PUT /hicache/storage-backend" in n for n in found["notes"]), found["notes"]
    live = LiveSet.of(FlagSchema.from_probe_output({**SCHEMA.to_json(), "live": found}, "x"))
    assert choose(BASE, _with(schedule_conservativeness=0.5), live, SCHEMA).kind == "live"


def _with(**levers: object) -> LeverSet:
    return LeverSet({**BASE.levers, **levers})


def test_only_live_levers_change_live_and_a_mix_is_one_restart() -> None:
    path = choose(BASE, _with(log_requests=True, pp_max_micro_batch_size=8), LIVE, SCHEMA)
    assert path.kind == "live", path
    assert [s.mechanism for s in path.steps] == ["set_internal_state", "configure_logging"]
    mixed = choose(BASE, _with(log_requests=True, tp_size=4), LIVE, SCHEMA)
    assert mixed.kind == "restart"
    assert "tp_size needs a restart" in mixed.reason and "log_requests" in mixed.reason
    env = choose(BASE, LeverSet(_with(log_requests=True).levers, {"SGLANG_X": "1"}), LIVE, SCHEMA)
    assert env.kind == "restart" and "SGLANG_X" in env.reason
    assert choose(BASE, _with(model_path="/models/b"), LIVE, SCHEMA).kind == "weights"
    both = choose(BASE, _with(model_path="/models/b", log_requests=True), LIVE, SCHEMA)
    assert both.kind == "restart", both


def test_what_sglang_cannot_take_live_restarts_and_says_why() -> None:
    """An absent value ConfigureLoggingReq reads as 'keep it'; a storage backend needs the
    hierarchical cache and an admin key; LoRA needs LoRA enabled."""
    start = LeverSet({**BASE.levers, "crash_dump_folder": "/tmp/crash"})
    removed = choose(start, BASE, LIVE, SCHEMA)
    assert removed.kind == "restart" and "crash_dump_folder removed" in removed.reason
    no_key = choose(
        _with(enable_hierarchical_cache=True),
        _with(enable_hierarchical_cache=True, hicache_storage_backend="file"),
        LIVE,
        SCHEMA,
    )
    assert no_key.kind == "restart" and "admin_api_key" in no_key.reason
    keyed = {"enable_hierarchical_cache": True, "admin_api_key": "k"}
    attach = choose(_with(**keyed), _with(**keyed, hicache_storage_backend="file"), LIVE, SCHEMA)
    assert attach.kind == "live" and attach.steps[0].new["hicache_storage_backend"] == "file"
    no_lora = choose(BASE, _with(lora_paths=["a=/x"]), LIVE, SCHEMA)
    assert no_lora.kind == "restart" and "LoRA is not enabled" in no_lora.reason
    on = _with(enable_lora=True)
    lora = choose(on, _with(enable_lora=True, lora_paths=["a=/x"]), LIVE, SCHEMA)
    assert lora.kind == "live"


def test_lora_paths_read_as_sglang_reads_them() -> None:
    """srt/arg_groups/lora_hook.py:75-110: name=path, a bare path, or a JSON object."""
    pinned = json.dumps({"lora_name": "c", "lora_path": "/z", "pinned": True})
    got = lora_adapters(["a=/x", "/y", pinned])
    assert {(a.name, a.path, a.pinned) for a in got.values()} == {
        ("a", "/x", False),
        ("/y", "/y", False),
        ("c", "/z", True),
    }
    with pytest.raises(ValueError, match="lora_name"):
        lora_adapters(['{"lora_path": "/z"}'])


def test_the_schema_says_which_levers_change_live(tmp_path: Path) -> None:
    """GET /levers/schema: each flag's ``live_via`` (None for a restart lever) and the set
    with where in SGLang's source it was read."""

    async def body() -> None:
        async with api_client(tmp_path) as (client, _rig, _app):
            r = await client.get("/levers/schema", params={"q": "log_requests"})
            flags = {f["dest"]: f for f in r.json()["flags"]}
            assert flags["log_requests"]["live_via"] == "POST /configure_logging"
            r = await client.get("/levers/schema", params={"q": "tp_size"})
            assert {f["dest"]: f["live_via"] for f in r.json()["flags"]}["tp_size"] is None
            live = r.json()["live_levers"]["mechanisms"]
            assert live["set_internal_state"]["where"].startswith(
                "srt/managers/scheduler_components/internal_state.py:"
            )

    run(body)
