"""The deployment assets match the daemon: the example config loads, the alerts and the
dashboard use only metrics the daemon exports, the systemd unit has what teardown needs.

promtool and systemd-analyze checks of the same files are in scripts/check-deploy.sh.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_supervisor.config import (
    ApiSettings,
    RouterSettings,
    ServerSettings,
    Settings,
    SimulateSettings,
    TimeoutSettings,
    load_settings,
)
from sglang_supervisor.sglang.levers import LeverSet, check_levers
from sglang_supervisor.sglang.schema import load_bundled
from sglang_supervisor.slurm.settings import SlurmSettings
from sglang_supervisor_api.cli.main import build_parser
from tests.helpers import Daemon, wait_until

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "config.example.toml"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "sglang-supervisor.json"
UNIT = ROOT / "systemd" / "sglang-supervisor.service"
DROP_IN = ROOT / "systemd" / "sglang-supervisor.service.d" / "keep-server-on-daemon-restart.conf"

METRIC = re.compile(r"\bsglang_supervisor_[a-z_]+")
_KEY = re.compile(r"^#?\s*([a-z_]+)\s*=")
_SECTION = re.compile(r"^\[([a-z_.]+)\]\s*$")


# ------------------------------------------------------------------ example config


def example_keys() -> dict[str, set[str]]:
    """Keys per TOML section of the example, set or commented out (``# key = value``)."""
    keys: dict[str, set[str]] = {"": set()}
    section = ""
    for line in EXAMPLE.read_text().splitlines():
        if m := _SECTION.match(line):
            section = m.group(1)
            keys.setdefault(section, set())
        elif m := _KEY.match(line):
            keys[section].add(m.group(1))
    return keys


def commented_levers() -> dict[str, Any]:
    """The ``# name = value`` lines of [server.levers]: levers shown but not set."""
    out: dict[str, Any] = {}
    section = ""
    for line in EXAMPLE.read_text().splitlines():
        if m := _SECTION.match(line):
            section = m.group(1)
        elif section == "server.levers" and re.match(r"^# [a-z_]+ = \S", line):
            out.update(tomllib.loads(line[2:]))
    return out


def test_example_config_loads() -> None:
    settings = load_settings(EXAMPLE, {})
    assert not settings.simulate
    assert settings.server.gpus == [str(i) for i in range(8)]
    assert settings.server.levers["tp_size"] == 8
    assert settings.server.env == {"NCCL_DEBUG": "WARN"}
    # Listening beyond loopback needs a token: the example names a token file.
    assert settings.api.host == "0.0.0.0" and settings.api.token_file
    # The initial levers (and the commented-out ones) pass the daemon's own lever check.
    schema = load_bundled()
    check_levers(LeverSet(settings.server.levers, settings.server.env), schema)
    shown = commented_levers()
    assert "enable_hierarchical_cache" in shown
    check_levers(LeverSet({**settings.server.levers, **shown}, {}), schema)


def test_example_config_shows_every_option() -> None:
    keys = example_keys()
    sections: dict[str, type[Any]] = {
        "": Settings,
        "api": ApiSettings,
        "server": ServerSettings,
        "timeouts": TimeoutSettings,
        "router": RouterSettings,
        "sim": SimulateSettings,
        "slurm": SlurmSettings,
    }
    tables = {"api", "server", "timeouts", "router", "sim", "slurm", "levers", "env"}
    missing = [
        f"[{section}] {name}" if section else name
        for section, model in sections.items()
        for name in model.model_fields
        if name not in tables and name not in keys.get(section, set())
    ]
    assert not missing, f"options not in {EXAMPLE.name}: {missing}"
    assert {"server.levers", "server.env"} <= set(keys)


# ------------------------------------------------------------------ metric names


def used_metric_names() -> dict[str, set[str]]:
    """``sglang_supervisor_*`` names in the alert rules and in the dashboard's queries."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    variables = [str(v.get("definition", "")) for v in dashboard["templating"]["list"]]
    return {
        ALERTS.name: set(METRIC.findall(ALERTS.read_text())),
        DASHBOARD.name: set(METRIC.findall("\n".join(exprs + variables))),
    }


def exported_names(text: str) -> set[str]:
    """Sample names (``_total``, ``_bucket``, ``_sum``, ``_count`` included) and families."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(s.name for s in family.samples)
    return names


#: Exported only with ``[router] url`` (checked against a real sglang-router in
#: tests/integration/test_router.py, which reads it at 1 and 0).
ROUTER_ONLY = {"sglang_supervisor_router_worker_registered"}


def test_alerts_and_dashboard_use_only_exported_metrics(daemon_factory: type[Daemon]) -> None:
    used = {src: names - ROUTER_ONLY for src, names in used_metric_names().items()}
    assert len(used[ALERTS.name]) >= 8 and len(used[DASHBOARD.name]) >= 15, used
    d = daemon_factory().start()
    # An apply, so the histograms, operation counters and last-apply time have samples.
    op = d.apply({"mem_fraction_static": 0.9}).json()["operation"]
    assert op["state"] == "succeeded", op

    def missing() -> dict[str, list[str]]:
        r = d.client.get("/metrics")
        assert r.status_code == 200, r.text
        exported = exported_names(r.text)
        return {src: sorted(names - exported) for src, names in used.items() if names - exported}

    # The server's throughput is re-exported once the daemon has scraped it (every 2 s).
    try:
        wait_until(lambda: not missing(), 10, 0.2, "every metric the deploy assets use")
    except AssertionError:
        pytest.fail(f"metrics used but not exported by the daemon: {missing()}")


# ------------------------------------------------------------------ systemd unit


def unit_directives(path: Path) -> dict[str, dict[str, list[str]]]:
    """``{section: {key: [values...]}}`` of a unit file (keys may repeat)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            out.setdefault(section, {})
            continue
        key, _, value = line.partition("=")
        out[section].setdefault(key.strip(), []).append(value.strip())
    return out


def seconds(value: str) -> float:
    """systemd time spans used here: ``360``, ``360s``, ``6min``, ``5min 30s``."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit]
    return total


def one(d: dict[str, list[str]], key: str) -> str:
    values = d.get(key, [])
    assert len(values) == 1, f"{key}: {values}"
    return values[0]


def test_unit_has_the_directives_teardown_needs() -> None:
    unit = unit_directives(UNIT)
    service = unit["Service"]
    assert one(service, "Type") == "notify"
    assert one(service, "NotifyAccess") == "main"
    assert seconds(one(service, "WatchdogSec")) > 0
    # The daemon stops the server itself; systemd SIGKILLs only what is left afterwards.
    assert one(service, "KillMode") == "mixed"
    assert seconds(one(service, "TimeoutStopSec")) >= 120
    assert one(service, "Restart") == "on-failure"
    assert "StartLimitBurst" in unit["Unit"] and "StartLimitIntervalSec" in unit["Unit"]
    for key in ("StateDirectory", "ConfigurationDirectory"):
        assert one(service, key) == "sglang-supervisor"
    assert one(service, "ConfigurationDirectoryMode") == "0750"
    # The daemon logs to the journal: a LogsDirectory= would be an empty directory.
    assert "LogsDirectory" not in service
    # A rank OOM-killed by the kernel is the daemon's to handle, not a reason to stop it.
    assert one(service, "OOMPolicy") == "continue"
    assert "nvidia-fabricmanager.service" in " ".join(unit["Unit"]["After"])
    assert any("runbooks.md" in d for d in unit["Unit"]["Documentation"])
    # A supplementary group that does not exist (render, on some hosts) fails the start.
    assert "render" not in " ".join(service.get("SupplementaryGroups", []))
    assert one(service, "LimitMEMLOCK") == "infinity"
    assert one(service, "User") == "sglang"
    # Settings that hide the GPUs or forbid CUDA's JIT must stay off.
    truthy = {"yes", "true", "1", "on"}
    for key in ("PrivateDevices", "MemoryDenyWriteExecute", "ProtectClock", "PrivateUsers"):
        assert not set(service.get(key, [])) & truthy, f"{key}= breaks NVML/CUDA"
    if set(service.get("DevicePolicy", [])) & {"closed", "strict"}:
        assert any("nvidia" in v for v in service.get("DeviceAllow", []))


def test_unit_commands_are_ones_the_cli_accepts() -> None:
    argv = shlex.split(one(unit_directives(UNIT)["Service"], "ExecStart"))
    assert argv[0].endswith("/sglang-supervisor")
    args = build_parser().parse_args(argv[1:])
    assert args.command == "serve" and str(args.config) == "/etc/sglang-supervisor/config.toml"


def test_drop_in_keeps_the_server_and_cleans_up_on_stop() -> None:
    service = unit_directives(DROP_IN)["Service"]
    assert one(service, "KillMode") == "process"
    argv = shlex.split(one(service, "ExecStopPost"))
    assert argv[1:] == [
        "cleanup",
        "--config",
        "/etc/sglang-supervisor/config.toml",
        "--only-if-stopped",
    ]
    parser = build_parser()
    if "cleanup" not in parser.format_usage():
        pytest.skip("the CLI has no cleanup command yet")
    args = parser.parse_args(argv[1:])
    assert args.command == "cleanup"


# ------------------------------------------------------------------ dashboard


def test_dashboard_is_grafana_json_on_a_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 36 and dashboard["uid"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert 'instance=~"$instance"' in target["expr"], panel["title"]


# ------------------------------------------------------------------ alerts and runbooks

ALERTS_TEST = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
_ALERT = re.compile(r"^\s*- alert: (\w+)\s*$", re.M)


def alert_blocks() -> dict[str, str]:
    """Each alert rule's text, by alert name."""
    text = ALERTS.read_text()
    starts = [(m.group(1), m.start()) for m in _ALERT.finditer(text)]
    ends = [s for _, s in starts[1:]] + [len(text)]
    return {name: text[start:end] for (name, start), end in zip(starts, ends, strict=True)}


def test_every_alert_has_a_severity_and_a_runbook_section() -> None:
    blocks = alert_blocks()
    assert len(blocks) >= 14, sorted(blocks)
    headings = {
        line[3:].strip().lower()
        for line in RUNBOOKS.read_text().splitlines()
        if line.startswith("## ")
    }
    for name, block in blocks.items():
        assert re.search(r"severity: (critical|warning)\b", block), name
        m = re.search(r"runbook_url: (\S+)", block)
        assert m, f"{name} has no runbook_url"
        url = m.group(1)
        assert url.split("#")[0].endswith("/docs/runbooks.md"), url
        # GitHub's anchor of "## SglangServerDown" is #sglangserverdown.
        assert url.split("#")[1] == name.lower(), url
        assert name.lower() in headings, f"docs/runbooks.md has no section for {name}"


def test_every_incident_scenario_takes_a_position_on_every_alert() -> None:
    """promtool runs alerts_test.yml (scripts/check-deploy.sh); here: the tests named
    "scenario ..." list every alert at each of their eval times, so an alert added later
    cannot page during, say, a planned apply without a scenario failing."""
    alerts = set(alert_blocks())
    text = ALERTS_TEST.read_text()
    scenarios = re.split(r"^- name: ", text, flags=re.M)[1:]
    named = [s for s in scenarios if s.startswith(("scenario", "'scenario", '"scenario'))]
    assert len(named) >= 6, [s.splitlines()[0] for s in scenarios]
    for block in named:
        title = block.splitlines()[0]
        times = set(re.findall(r"eval_time: (\S+)", block))
        assert times, title
        for t in times:
            parts = block.split(f"eval_time: {t}\n")[1:]
            # type: ignore[union-attr]
            listed = {re.search(r"alertname: (\w+)", p).group(1) for p in parts}
            assert listed == alerts, f"{title} at {t}: missing {sorted(alerts - listed)}"


# ------------------------------------------------------------------ install recipe

README = ROOT / "README.md"


def readme_recipe() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Installing on a GPU host") :]
    block = section[section.index("```bash\n") + 8 :]
    return block[: block.index("```")].strip().splitlines()


def unit_recipe() -> list[str]:
    lines = UNIT.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# Install ("))
    out = []
    for line in lines[start + 1 :]:
        if line.strip() == "#":
            break
        if line.startswith("#   "):
            out.append(line[4:])
        elif not line.startswith("# "):
            break
    return out


def test_the_readme_and_the_unit_give_one_install_recipe() -> None:
    readme, unit = readme_recipe(), unit_recipe()
    assert len(readme) >= 15
    assert readme == unit
    recipe = "\n".join(readme)
    assert "--shell /usr/sbin/nologin" in recipe and "python3-venv" in recipe
    assert "getent group render" in recipe  # render only where the group exists
    assert "python3.11" in recipe  # 22.04


def test_the_install_recipe_is_valid_bash(tmp_path: Path) -> None:
    import subprocess

    script = tmp_path / "install.sh"
    script.write_text("\n".join(readme_recipe()) + "\n")
    subprocess.run(["bash", "-n", str(script)], check=True)
