"""The status page in a real headless Chromium (Debian's ``chromium``), driven like an
operator would: token, an apply (dry run first, then confirm; phases, GPU memory falling
during release, the server's log during start), then a change that rolls back.

Driven over the Chrome DevTools protocol through ``--remote-debugging-pipe``
(tests/cdp.py says why). With ``SGLANG_SUPERVISOR_SCREENSHOTS=docs`` the screenshots the
README shows are written to docs/; otherwise to the test's temporary directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.cdp import Browser, Page, find_chromium
from tests.helpers import Daemon

CHROMIUM = find_chromium()
if CHROMIUM is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI: chromium is missing (scripts/test.sh installs it as root)")
    pytest.skip("needs Debian's chromium (scripts/test.sh installs it)", allow_module_level=True)

TOKEN = "page-test-token-5c1e0a"
STATE = "document.getElementById('state').dataset.state"


def outcome_row(p: Page) -> tuple[str, str, str]:
    """(kind, outcome, reason) of the newest operation that is not a dry run."""
    rows = p.js(
        "[...document.querySelectorAll('#operations tbody tr')].map(r => "
        "[...r.children].map(c => c.innerText))"
    )
    for row in rows:
        if "dry run" not in row[1]:
            return row[1], row[2], row[4]
    return "", "", ""


def lever(p: Page, name: str) -> tuple[str, str]:
    row = p.js(
        f"(() => {{ const r = document.querySelector('#levers tr[data-lever=\"{name}\"]'); "
        "return r ? [r.querySelector('.cur').innerText, r.querySelector('.good').innerText]"
        " : null })()"
    )
    assert row is not None, f"no lever row {name}"
    return row[0], row[1]


def apply_through_the_form(p: Page, levers: str, env: str = "") -> None:
    p.fill("#apply-levers", levers)
    p.fill("#apply-env", env)
    assert p.js("document.getElementById('confirm').disabled"), "apply before a dry run"
    p.click("#dry-run")
    p.wait("!document.getElementById('confirm').disabled", 30, "the dry run to pass")
    result = p.text("#dry-result")
    assert "dry run succeeded" in result and "validate" in result and "preflight" in result
    # What would change, before the operator confirms: each lever, now -> after.
    first = levers.splitlines()[0]
    name, value = (x.strip() for x in first.split("=", 1))
    change = p.text(f"#changes tr[data-change='{name}']")
    assert change.split("\t")[0] == name and change.endswith(f"→ {value}"), change
    # SGLang's resolved values, when the validation reports them, are shown before confirming.
    assert p.js(
        "!!document.getElementById('resolved') || !!document.getElementById('resolved-none')"
    )
    # And the checks that did not run (never an empty "checked"): one row per not_run.
    assert p.js("document.querySelectorAll('#not-run tr').length") > 0, result
    p.click("#confirm")


def test_status_page_through_an_apply_and_a_rollback(
    daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    shots = Path(os.environ.get("SGLANG_SUPERVISOR_SCREENSHOTS") or tmp_path)
    d = daemon_factory(sim={"startup_s": 1.5})
    d.env["SGLANG_SUPERVISOR_TOKEN"] = TOKEN
    d.client.headers["Authorization"] = f"Bearer {TOKEN}"
    d.start()
    assert CHROMIUM is not None
    browser = Browser(CHROMIUM)
    try:
        p = browser.page()
        p.goto(d.url + "/")
        # The daemon has a token: the page asks for it once, then shows the server.
        p.wait(
            "document.getElementById('token-box').style.display === 'block'", 15, "the token box"
        )
        p.fill("#token-input", TOKEN)
        p.click("#token-save")
        p.wait(f"{STATE} === 'ready'", 15, "state ready")
        assert p.js("sessionStorage.getItem('sglang-supervisor-token')") == TOKEN
        assert lever(p, "mem_fraction_static") == ("0.85", "0.85")
        gpus = p.js("document.querySelectorAll('#gpus .gpu').length")
        assert gpus == 4 and "1 ours" in p.text("#gpus")
        p.wait("document.getElementById('connection').innerText === 'live'", 15, "the event stream")

        # An apply: dry run, confirm, then the phases live.
        apply_through_the_form(
            p,
            "mem_fraction_static = 0.9",
            "SGLANG_SIM_LOAD = rate=3,avg_tokens=2000\nSGLANG_PAGE_TOKEN = s3cret-page",
        )
        # The new server's log, shown while it starts.
        p.wait(
            f"{STATE} === 'starting' && "
            "document.getElementById('server-log').innerText.includes('TP0')",
            30,
            "the server's log during start",
        )
        p.wait(
            "/operation \\w+: succeeded/.test(document.getElementById('apply-state').innerText)", 60
        )
        phases = p.text("#phases")
        for name in ("validate", "preflight", "stop", "release", "start", "probation", "commit"):
            assert re.search(rf"^{name}\s+succeeded", phases, re.M), (name, phases)
        # Per-GPU memory during release: from what the server held down to the baseline.
        falls = re.findall(r"GPU (\d): ([\d.]+) GiB → ([\d.]+) GiB", p.text("#release"))
        assert len(falls) == 4 and all(float(a) > 100 > float(b) for _, a, b in falls), falls
        kind, outcome, _ = outcome_row(p)
        assert (kind, outcome) == ("apply", "succeeded")
        p.wait(f"{STATE} === 'ready'", 15)
        p.wait(
            "document.querySelector('#levers tr[data-lever=\"mem_fraction_static\"] .good')"
            ".innerText === '0.9'",
            15,
        )
        assert lever(p, "mem_fraction_static") == ("0.9", "0.9")
        assert lever(p, "env.SGLANG_PAGE_TOKEN") == ("<redacted>", "<redacted>")
        assert "s3cret-page" not in p.text("main").replace(
            p.js("document.getElementById('apply-env').value"), ""
        )
        # Load from the simulated traffic: the sparklines have points.
        p.wait(
            "!!document.querySelector('#spark-throughput polyline')", 30, "a throughput sparkline"
        )
        p.wait("document.getElementById('v-throughput').innerText !== '0'", 30, "throughput")
        p.screenshot(shots / "status-page-apply.png")

        # A change that fails at start (CUDA-graph capture OOM): rolled back, last-good serving.
        apply_through_the_form(p, "mem_fraction_static = 0.99")
        p.wait(
            "/rolled_back/.test(document.getElementById('apply-state').innerText)",
            60,
            "the rollback",
        )
        kind, outcome, reason = outcome_row(p)
        assert (kind, outcome) == ("apply", "rolled_back") and reason, (kind, outcome, reason)
        assert reason in p.text("#apply-state")
        assert re.search(r"^rollback_start\s+succeeded", p.text("#phases"), re.M), p.text("#phases")
        p.wait(f"{STATE} === 'ready'", 30)
        assert lever(p, "mem_fraction_static") == ("0.9", "0.9")
        p.screenshot(shots / "status-page-rollback.png")

        # /docs: the API reference from /openapi.json, usable with the tab's token.
        docs = browser.page()
        docs.goto(d.url + "/docs")
        docs.wait("!!document.getElementById('op-get-status')", 15, "the /status entry")
        assert "v" + str(d.status()["version"]) in "v" + docs.text("#version")
        docs.fill("#token", TOKEN)
        docs.click("#save-token")
        docs.js("document.getElementById('op-get-status').open = true")
        docs.click("#op-get-status [data-try]")
        docs.wait(
            "document.querySelector('#op-get-status [data-result-status]').innerText"
            ".startsWith('200')",
            15,
            "GET /status from the docs page",
        )
        assert '"state": "ready"' in docs.text("#op-get-status [data-result]"), docs.text(
            "#op-get-status"
        )
        assert p.exceptions() == [] and docs.exceptions() == []
    finally:
        browser.close()


def test_status_page_without_a_token_on_loopback(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory().start()
    assert CHROMIUM is not None
    browser = Browser(CHROMIUM)
    try:
        p = browser.page()
        p.goto(d.url + "/")
        p.wait(f"{STATE} === 'ready'", 15, "state ready")
        assert p.js("document.getElementById('token-box').style.display") != "block"
        assert "0.85" in p.text("#levers")
        p.wait("document.querySelectorAll('#operations tbody tr').length > 0", 15)
        assert outcome_row(p)[:2] == ("start", "succeeded")
        p.wait("document.getElementById('log-tail').innerText.length > 0", 15, "the log tail")
        # The server's own lines, not the supervisor's probes that fill its access log.
        assert "GET /health_generate" in d.client.get("/logs", params={"tail": 600}).text
        assert "GET /health_generate" not in p.text("#log-tail")
        # An operation started elsewhere (the CLI) shows up, and the page can cancel it.
        slow = d.apply(
            {"mem_fraction_static": 0.88}, env={"SGLANG_SIM_STARTUP_S": "20"}, wait=False
        ).json()["operation"]
        p.wait(
            f"{STATE} === 'starting' && !document.getElementById('cancel').hidden",
            20,
            "the running apply with its cancel button",
        )
        assert slow["id"] in p.text("#op-title")
        p.click("#cancel")
        p.wait(
            "document.querySelector('#operations tbody tr .outcome').innerText === 'rolled_back'",
            30,
            "the cancelled apply to roll back",
        )
        p.wait(f"{STATE} === 'ready'", 20)
        assert "0.85" in p.text("#levers") and "cancelled" in outcome_row(p)[2]
        assert p.exceptions() == []
    finally:
        browser.close()

