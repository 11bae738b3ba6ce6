"""A secret passed as a lever reaches the server and nothing the daemon shows."""

from __future__ import annotations

import json
from pathlib import Path

import psutil

from tests.helpers import Daemon, wait_until

SECRET = "sk-live-4f8a1c"
#: Shorter than redact.MIN_SECRET_CHARS: no literal search hides it, only the rule for the
#: forms SGLang prints it in (issue 27 §1: ``'api_key': 'k1234'`` passed the journal's).
SHORT_KEY = "k1234"
ENV_SECRET = "tok-93b2e7"
#: Inside a URL-valued variable whose name says nothing (issue 20 §4).
URL_SECRET = "pw-5c0d2a"
HF_ENDPOINT = f"https://mirror-user:{URL_SECRET}@hf-mirror.internal/"


def _members_cmdlines(pid: int) -> str:
    root = psutil.Process(pid)
    return "\n".join(" ".join(p.cmdline()) for p in [root, *root.children(recursive=True)])


def test_secrets_are_redacted_on_every_path_out_and_kept_off_the_servers_argv(
    daemon_factory: type[Daemon],
) -> None:
    """Every path out of the daemon (the answers, /logs, every operation's log_tail, the
    events, the audit log, the journal) hides the server's secrets, the ones in SGLang's
    own ``server_args={...}`` line at start included, whatever their length; the server
    gets its key from a ``--config`` file, not its world-readable command line."""
    d = daemon_factory(extra={"server": {"log_to_journal": True}})
    d.start()
    secrets = {"api_key": SHORT_KEY, "admin_api_key": SECRET}
    r = d.apply(secrets, env={"SGLANG_EXTRA_TOKEN": ENV_SECRET, "HF_ENDPOINT": HF_ENDPOINT})
    assert r.status_code == 200, r.text
    op = r.json()["operation"]
    assert op["state"] == "succeeded", op
    # The server got them: its environment, and its arguments through its --config file
    # (its own log prints them as SGLang does); its command line has none.
    pid = d.status()["server"]["pid"]
    assert psutil.Process(pid).environ()["SGLANG_EXTRA_TOKEN"] == ENV_SECRET
    assert psutil.Process(pid).environ()["HF_ENDPOINT"] == HF_ENDPOINT
    argv = _members_cmdlines(pid)
    assert SHORT_KEY not in argv and SECRET not in argv and "--config" in argv, argv
    server_log = Path(d.status()["server"]["log_path"])
    printed = wait_until(
        lambda: "server_args=" in server_log.read_text() and server_log.read_text(),
        10,
        0.02,
        "the server's server_args line",
    )
    assert f"'api_key': '{SHORT_KEY}'" in printed and f"'admin_api_key': '{SECRET}'" in printed
    # A launch that fails prints them too, and its log tail is in the operation.
    bad = d.apply({"tp_size": 2}, env={"SGLANG_SIM_FAULTS": "crash_on_start"}).json()
    bad_op = bad["operation"]
    assert bad_op["state"] == "rolled_back", bad_op
    assert any("'api_key': '<redacted>'" in line for line in bad_op["log_tail"]), bad_op
    d.wait_state("ready")
    # Nothing the daemon shows has them (audit.log: once its thread wrote the apply).
    audit_path = d.dir / "state" / "audit.log"

    def audit_with_the_apply() -> str | None:
        text = audit_path.read_text()
        return text if text.count('"action": "apply"') >= 2 else None

    audit_text = wait_until(audit_with_the_apply, 10, 0.02, "the applies in audit.log")
    shown = {
        "POST /levers": r.text,
        "POST /levers (rolled back)": json.dumps(bad),
        "GET /status": d.client.get("/status").text,
        "GET /levers": d.client.get("/levers").text,
        f"GET /operations/{op['id']}": d.client.get(f"/operations/{op['id']}").text,
        f"GET /operations/{bad_op['id']}": d.client.get(f"/operations/{bad_op['id']}").text,
        "GET /operations": d.client.get("/operations").text,
        "GET /logs": d.client.get("/logs", params={"tail": 1000}).text,
        "GET /logs?launch=1": d.client.get("/logs", params={"launch": 1, "tail": 1000}).text,
        "audit.log": audit_text,
        "POST /plan": d.client.post("/plan", json={}).text,
    }
    assert "'api_key': '<redacted>'" in shown["GET /logs"], shown["GET /logs"][-2000:]
    with d.client.stream("GET", "/events", params={"replay": "true"}) as events:
        text = ""
        for chunk in events.iter_text():
            text += chunk
            if text.count('"kind": "operation"') >= 4 and "rolled_back" in text:
                break
    shown["GET /events"] = text
    assert d.stop() == 0  # the journal has the server's last lines too
    shown["the daemon's log (the journal)"] = d.log_path.read_text(errors="replace")
    assert "'api_key': '<redacted>'" in shown["the daemon's log (the journal)"]
    for where, body in shown.items():
        for secret in (SHORT_KEY, SECRET, ENV_SECRET, URL_SECRET):
            assert secret not in body, f"{where} shows {secret!r}"
    lever_view = json.loads(shown["GET /levers"])
    assert lever_view["levers"]["api_key"] == "<redacted>"
    assert lever_view["env"]["SGLANG_EXTRA_TOKEN"] == "<redacted>"
    assert lever_view["env"]["HF_ENDPOINT"] == "https://mirror-user:<redacted>@hf-mirror.internal/"


def test_a_refused_misspelt_secret_is_not_in_the_audit_log(daemon_factory: type[Daemon]) -> None:
    """A lever the schema does not know (``api-kye``) or an env name in lower case
    (``hf_token``) is not secret-named: a refused apply wrote its value into audit.log
    and, through the audit logger, the journal."""
    d = daemon_factory().start()
    r = d.apply({"api-kye": SECRET}, env={"hf_token": ENV_SECRET})
    assert r.status_code == 422, r.text
    audit_path = d.dir / "state" / "audit.log"

    def audit_with_the_refusal() -> str | None:
        text = audit_path.read_text()
        return text if '"refused"' in text else None

    text = wait_until(audit_with_the_refusal, 10, 0.02, "the refused apply in audit.log")
    assert SECRET not in text and ENV_SECRET not in text, text
    assert '"api-kye"' in text and '"env.hf_token"' in text, text  # named, not shown
    journal = d.log_path.read_text(errors="replace")
    assert SECRET not in journal and ENV_SECRET not in journal
