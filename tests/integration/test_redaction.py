"""A secret passed as a lever reaches the server and nothing the daemon shows."""

from __future__ import annotations

import psutil

from tests.helpers import Daemon, wait_until

SECRET = "sk-live-4f8a1c"
ENV_SECRET = "tok-93b2e7"
#: Inside a URL-valued variable whose name says nothing (issue 20 §4).
URL_SECRET = "pw-5c0d2a"
HF_ENDPOINT = f"https://mirror-user:{URL_SECRET}@hf-mirror.internal/"


def test_api_key_and_token_env_are_redacted_everywhere_but_the_server(
    daemon_factory: type[Daemon],
) -> None:
    d = daemon_factory().start()
    r = d.apply(
        {"api_key": SECRET}, env={"SGLANG_EXTRA_TOKEN": ENV_SECRET, "HF_ENDPOINT": HF_ENDPOINT}
    )
    assert r.status_code == 200, r.text
    op = r.json()["operation"]
    assert op["state"] == "succeeded", op
    # The server got them.
    pid = d.status()["server"]["pid"]
    assert SECRET in psutil.Process(pid).cmdline()
    assert psutil.Process(pid).environ()["SGLANG_EXTRA_TOKEN"] == ENV_SECRET
    assert psutil.Process(pid).environ()["HF_ENDPOINT"] == HF_ENDPOINT
    # Nothing the daemon shows has them (audit.log: once its thread wrote the apply).
    audit_path = d.dir / "state" / "audit.log"

    def audit_with_the_apply() -> str | None:
        text = audit_path.read_text()
        return text if '"action": "apply"' in text else None

    audit_text = wait_until(audit_with_the_apply, 10, 0.02, "the apply in audit.log")
    shown = {
        "POST /levers": r.text,
        "GET /status": d.client.get("/status").text,
        "GET /levers": d.client.get("/levers").text,
        f"GET /operations/{op['id']}": d.client.get(f"/operations/{op['id']}").text,
        "audit.log": audit_text,
        "POST /plan": d.client.post("/plan", json={}).text,
    }
    with d.client.stream("GET", "/events", params={"replay": "true"}) as events:
        text = ""
        for chunk in events.iter_text():
            text += chunk
            if '"kind": "operation"' in text and "succeeded" in text:
                break
    shown["GET /events"] = text
    for where, body in shown.items():
        assert SECRET not in body and ENV_SECRET not in body, f"{where} shows a secret"
        assert URL_SECRET not in body, f"{where} shows a URL's password"
    levers = d.client.get("/levers").json()
    assert levers["levers"]["api_key"] == "<redacted>"
    assert levers["env"]["SGLANG_EXTRA_TOKEN"] == "<redacted>"
    assert levers["env"]["HF_ENDPOINT"] == "https://mirror-user:<redacted>@hf-mirror.internal/"


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
