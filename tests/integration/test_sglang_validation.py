"""Levers checked by the real SGLang 0.5.23 parser (``.venv-sglang``, built by
``scripts/sglang-parser-env.sh``), against a running simulated server.

Every refused request must leave the running server alone: same pid, still ready.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor.sglang.parser import read_schema
from sglang_supervisor.sglang.schema import FlagSchema, load_bundled
from tests.helpers import Daemon
from tests.sglang_env import ROOT, SGLANG_PYTHON, needs_sglang

pytestmark = needs_sglang()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(
        tmp_path_factory.mktemp("sgl"),
        gpus=4,
        extra={"server": {"python": SGLANG_PYTHON}},
        sim={"host_ram_gib": 256},
    )
    d.start()
    yield d
    assert d.stop() == 0
    d.client.close()


def _refused(
    d: Daemon, levers: dict[str, Any] | None = None, env: dict[str, Any] | None = None
) -> list[dict[str, str]]:
    pid = d.status()["server"]["pid"]
    r = d.apply(levers, env)
    assert r.status_code == 422, r.text
    s = d.status()
    assert s["server"]["pid"] == pid and s["state"] == "ready", (
        "a refused request touched the server"
    )
    problems: list[dict[str, str]] = r.json()["detail"]["problems"]
    return problems


def test_the_live_schema_is_read_from_sglang(daemon: Daemon) -> None:
    r = daemon.client.get("/levers/schema", params={"q": "mem_fraction"})
    body = r.json()
    assert body["live"] is True and body["source"] == SGLANG_PYTHON
    assert body["sglang_version"] == "0.5.23"
    assert "mem_fraction_static" in [f["dest"] for f in body["flags"]]
    assert daemon.status()["schema"]["source"] == SGLANG_PYTHON


def test_unknown_flag(daemon: Daemon) -> None:
    (p,) = _refused(daemon, {"mem_fraction_statik": 0.9})
    assert p["lever"] == "mem_fraction_statik" and "mem_fraction_static" in p["message"]


def test_abbreviation_is_refused_though_argparse_would_take_it(daemon: Daemon) -> None:
    (p,) = _refused(daemon, {"mem_fraction": 0.9})
    assert p["lever"] == "mem_fraction" and "abbreviations are not accepted" in p["message"]


def test_bad_choice(daemon: Daemon) -> None:
    (p,) = _refused(daemon, {"kv_cache_dtype": "fp9"})
    assert p["lever"] == "kv_cache_dtype" and "fp8_e4m3" in p["message"]


def test_bad_type(daemon: Daemon) -> None:
    (p,) = _refused(daemon, {"max_running_requests": "lots"})
    assert p["lever"] == "max_running_requests" and "integer" in p["message"]


def test_owned_flag(daemon: Daemon) -> None:
    problems = _refused(daemon, {"port": 31000, "enable_metrics": False})
    assert {p["lever"] for p in problems} == {"port", "enable_metrics"}


@pytest.mark.parametrize("name", ["LD_PRELOAD", "PYTHONPATH", "PATH"])
def test_env_injection(daemon: Daemon, name: str) -> None:
    (p,) = _refused(daemon, env={name: "/tmp/evil"})
    assert p["lever"] == f"env.{name}"


def test_cross_field_check_of_sglang_itself(daemon: Daemon) -> None:
    # Valid flag by flag; SGLang's own check_server_args refuses the combination.
    (p,) = _refused(daemon, {"served_model_name": "llama:v2"})
    assert p["lever"] == "served_model_name" and "colon" in p["message"]
    assert "SGLang 0.5.23" in p["message"]


def test_hicache_host_ram_overcommit(daemon: Daemon) -> None:
    # 4 ranks × 80 GB = 320 GB > 256 GiB simulated host RAM − SGLang's 10 GiB margin.
    (p,) = _refused(daemon, {"enable_hierarchical_cache": True, "hicache_size": 80})
    assert p["lever"] == "hicache_size" and "320.0 GB" in p["message"]


def test_tp_larger_than_managed_gpus(daemon: Daemon) -> None:
    (p,) = _refused(daemon, {"tp_size": 8})
    assert (
        p["lever"] == "tp_size" and "needs 8 GPUs" in p["message"] and "manages 4" in p["message"]
    )


def test_shell_metacharacters_arrive_verbatim_as_one_argument(daemon: Daemon) -> None:
    name = "llama; rm -rf / $(touch /tmp/pwned) `id` 'q' \"dq\" && echo | cat > x"
    r = daemon.apply({"served_model_name": name})
    assert r.status_code == 200 and r.json()["operation"]["state"] == "succeeded", r.text
    pid = daemon.status()["server"]["pid"]
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    i = argv.index(b"--served-model-name")
    assert argv[i + 1].decode() == name
    info = daemon.client.get("/status").json()
    assert info["levers"]["served_model_name"] == name
    assert not Path("/tmp/pwned").exists()
    daemon.apply({"served_model_name": None})


def test_validation_timings_are_reported(daemon: Daemon) -> None:
    r = daemon.apply({"chunked_prefill_size": 4096}, dry_run=True)
    validate = r.json()["operation"]["phases"][0]
    assert validate["name"] == "validate"
    assert "SGLang's parser, resolution and checks" in validate["detail"]
    assert (
        "SGLang's model-dependent resolution and checks (needs the model config"
        in (validate["detail"])
    )  # sim/llama
    assert "SGLang's model-dependent resolution and checks" in [
        n["check"] for n in r.json()["operation"]["not_run"]
    ]


def test_bundled_schema_equals_the_real_parser() -> None:
    live = read_schema(SGLANG_PYTHON)
    bundled = load_bundled()
    assert live.sglang_version == bundled.sglang_version

    def comparable(s: FlagSchema) -> dict[str, Any]:
        return {k: {**v.to_json()} for k, v in sorted(s.flags.items())}

    assert comparable(live) == comparable(bundled)
    # Which flags SGLang changes live: read in the server's interpreter, as the daemon does.
    assert live.live == bundled.live and live.live["configure_logging"]["levers"]


def test_schema_command_regenerates_the_bundled_file(tmp_path: Path) -> None:
    # scripts/gen_schema.py is how the bundled file is made; its output must match it.
    out = subprocess.run(
        [SGLANG_PYTHON, "-I", str(ROOT / "supervisor" / "sglang" / "schema_probe.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    fresh = json.loads(out.stdout)
    shipped = json.loads((ROOT / "supervisor" / "data" / "sglang-0.5.23.json").read_text())
    assert fresh == shipped, "run: python scripts/gen_schema.py " + shlex.quote(SGLANG_PYTHON)
