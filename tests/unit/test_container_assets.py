"""deploy/container: the Containerfile's instructions (parsed by BuildKit's own parser,
PyPI's ``dockerfile``), and the pod example's config and timings against the daemon's.
The manifests' schema is checked by scripts/check-deploy.sh (kubernetes-validate, kubectl)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Any

import dockerfile
import pytest
import yaml

from sglang_supervisor.config import load_settings

ROOT = Path(__file__).parents[2]
CONTAINERFILE = ROOT / "deploy" / "container" / "Containerfile"
POD = ROOT / "deploy" / "container" / "pod.yaml"
STATE = "/var/lib/sglang-supervisor"


def instructions() -> dict[str, list[dockerfile.Command]]:
    by: dict[str, list[dockerfile.Command]] = {}
    for cmd in dockerfile.parse_file(str(CONTAINERFILE)):
        by.setdefault(cmd.cmd, []).append(cmd)
    return by


def docs() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(POD.read_text())}


def test_the_daemon_is_the_entrypoint_on_sglangs_image() -> None:
    ins = instructions()
    assert all(f.value[0] == "${SGLANG_IMAGE}" for f in ins["FROM"])
    (arg,) = ins["ARG"]
    assert arg.value[0].startswith("SGLANG_IMAGE=lmsysorg/sglang:v0.5.23")
    (entry,) = ins["ENTRYPOINT"]
    assert entry.json, "exec form: the daemon is PID 1 and gets SIGTERM itself"
    assert entry.value[:2] == ("/opt/sglang-supervisor/bin/sglang-supervisor", "serve")
    assert entry.value[entry.value.index("--state-dir") + 1] == STATE
    assert "CMD" not in ins
    assert [v.value for v in ins["VOLUME"]] == [(STATE,)]
    assert [e.value for e in ins["EXPOSE"]] == [("8470",)]
    (check,) = ins["HEALTHCHECK"]
    assert "http://127.0.0.1:8470/healthz" in " ".join(check.value)
    assert [s.value for s in ins["STOPSIGNAL"]] == [("SIGTERM",)]
    assert ins["USER"][-1].value[0] != "root"


def test_the_pod_config_is_one_the_daemon_accepts(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(docs()["ConfigMap"]["data"]["config.toml"])
    settings = load_settings(config, {})
    assert settings.api.host == "0.0.0.0" and settings.api.port == 8470
    assert str(settings.state_dir) == STATE
    assert settings.server.python == "/usr/local/bin/sglang-python"
    assert tomllib.loads(config.read_text())["server"]["levers"]["tp_size"] == 8


def test_the_pod_probes_the_daemon_and_waits_out_its_stop(tmp_path: Path) -> None:
    d = docs()
    config = tmp_path / "config.toml"
    config.write_text(d["ConfigMap"]["data"]["config.toml"])
    settings = load_settings(config, {})
    spec = d["Pod"]["spec"]
    # The kubelet's SIGKILL only after the daemon's own stop budget has run out.
    assert spec["terminationGracePeriodSeconds"] > settings.timeouts.stop_budget_s
    (c,) = spec["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["api"] == settings.api.port
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = c[probe]["httpGet"]
        assert (get["path"], get["port"]) == (path, "api")
        # The daemon answers 421 to a Host it does not know (the pod IP): name localhost.
        assert {"name": "Host", "value": "localhost"} in get["httpHeaders"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "persistentVolumeClaim" in volumes[mounts[STATE]]
    assert "configMap" in volumes[mounts["/etc/sglang-supervisor"]]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"]}
    assert env["SGLANG_SUPERVISOR_TOKEN"] == {
        "name": "sglang-supervisor-secrets",
        "key": "api-token",
    }
    # The token is made on the spot (the header's kubectl create secret): one written in
    # the example, kept in git, would be a token everyone knows, and the daemon takes it.
    assert "Secret" not in d, "pod.yaml must not ship a token"
    assert "kubectl create secret generic sglang-supervisor-secrets" in POD.read_text()


@pytest.mark.parametrize("what", ["ENTRYPOINT", "VOLUME"])
def test_a_containerfile_without_it_fails(what: str, tmp_path: Path, monkeypatch: Any) -> None:
    broken = tmp_path / "Containerfile"
    broken.write_text(
        "\n".join(
            line for line in CONTAINERFILE.read_text().splitlines() if not line.startswith(what)
        )
    )
    monkeypatch.setattr(sys.modules[__name__], "CONTAINERFILE", broken)
    with pytest.raises((AssertionError, KeyError, ValueError)):
        test_the_daemon_is_the_entrypoint_on_sglangs_image()
