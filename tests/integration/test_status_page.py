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
from typing import Any

import pytest

from tests.cdp import Browser, Page, find_chromium
from tests.helpers import Daemon, wait_until
from tests.sglang_env import SGLANG_PYTHON

CHROMIUM = find_chromium()
if CHROMIUM is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI: chromium is missing (scripts/test.sh installs it as root)")
    pytest.skip("needs Debian's chromium (scripts/test.sh installs it)", allow_module_level=True)

TOKEN = "page-test-token-5c1e0a"
SHOTS = os.environ.get("SGLANG_SUPERVISOR_SCREENSHOTS")


def as_documented() -> dict[str, Any]:
    """The daemon of the README's screenshots validates with SGLang's own parser, as one
    in production does: with ``SGLANG_SUPERVISOR_SCREENSHOTS`` set and the test
    command's SGLang environment there, ``server.python`` is that environment (start-up
    imports SGLang: slower). Otherwise the bundled schema, and the page says validation
    is degraded."""
    if SHOTS and Path(SGLANG_PYTHON).exists():
        return {"server": {"python": SGLANG_PYTHON}}
    return {}


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
    d = daemon_factory(sim={"startup_s": 1.5}, extra=as_documented())
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
        # Every chart marks the apply (where it began, a band while it ran, in its
        # outcome's colour), and its row shows its measured effect (being measured).
        ops = d.client.get("/operations", params={"limit": 5}).json()["operations"]
        applied = next(o["id"] for o in ops if o["kind"] == "apply" and not o["dry_run"])
        for chart in ("running", "queue", "ttft", "hit", "throughput", "kv"):
            mark = f"#spark-{chart} g.marker.m-succeeded[data-op='{applied}']"
            p.wait(f'!!document.querySelector("{mark}")', 15, f"the apply marked on {chart}")
        effect = p.text(f"#operations tr[data-op='{applied}'] td.effect")
        assert effect.startswith("measuring ("), effect
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
        # What the daemon sends is shown as text: a refused lever named like markup.
        p.fill("#apply-levers", "<b>x</b><img src onerror> = 1")
        p.click("#dry-run")
        p.wait("!!document.querySelector('#dry-result .problems li')", 15, "the refusal")
        assert "unknown lever '<b>x</b><img src onerror>'" in p.text("#dry-result .problems li")
        assert p.js("document.querySelector('#dry-result b, #dry-result img') === null")
        p.wait("document.querySelectorAll('#operations tbody tr').length > 0", 15)
        assert outcome_row(p)[:2] == ("start", "succeeded")
        p.wait("document.getElementById('log-tail').innerText.length > 0", 15, "the log tail")
        # The server's own lines: the supervisor's probes are kept out of SGLang's access
        # log by SGLang's own --uvicorn-access-log-exclude-prefixes (sglang/accesslog.py),
        # so neither /logs nor the page shows them.
        assert "GET /health_generate" not in d.client.get("/logs", params={"tail": 600}).text
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


#: A KV-bound load on the default simulated server (4 GPUs, tp 4, 0.85): ~33 requests of
#: ~32k tokens fit, so 14 a second queue up; the plan's fp8 KV cache fits ~74 (measured).
INCIDENT_LOAD = "rate=14,avg_tokens=32000"
DIAGNOSIS = "document.getElementById('diagnosis')"


def test_status_page_through_a_kv_bound_incident(
    daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    """The incident the page exists for: the simulator loaded until the server is KV-bound;
    the page shows the diagnosis with the plan, dry-runs it, applies it with a
    confirmation, and the banner clears once the new levers carry the load."""
    shots = Path(os.environ.get("SGLANG_SUPERVISOR_SCREENSHOTS") or tmp_path)
    d = daemon_factory(
        timeouts={"diagnosis_hold_s": 4},  # the alert's 3 minutes, shortened for the test
        # A host cache, if its evidence holds when the plan is asked, of ~560 GiB pinned at
        # 0.005 s/GiB: its cost shows, and the apply pins it in ~3 s.
        sim={"host_ram_gib": 640, "pin_s_per_gib": 0.005, "unpin_s_per_gib": 0.005},
        extra={
            "server": {
                "env": {"SGLANG_SIM_LOAD": INCIDENT_LOAD},
                **as_documented().get("server", {}),
            }
        },
    ).start()
    wait_until(
        lambda: d.status()["diagnosis"]["kind"] == "kv_bound", 40, 0.5, "the daemon's kv_bound"
    )
    assert CHROMIUM is not None
    browser = Browser(CHROMIUM)
    try:
        p = browser.page()
        p.goto(d.url + "/")
        # The charts come from the daemon's history at once (polls add one sample per 2 s).
        p.wait("(window.__page.hist || {t: []}).t.length >= 4", 3, "the history at once")
        for chart in ("running", "queue", "ttft", "hit", "throughput", "kv"):
            assert p.js(f"!!document.querySelector('#spark-{chart} polyline')"), chart
        p.wait(f"{DIAGNOSIS}.dataset.kind === 'kv_bound'", 10, "the kv_bound banner")
        assert p.js(f"{DIAGNOSIS}.style.display") == "block"
        assert "KV-cache bound" in p.text("#diagnosis") and "POST /plan" in p.text("#diagnosis")
        # The plan's proposal in the banner: each lever, now -> proposed.
        # (SGLang's own resolution, where the daemon has it, imports SGLang first: slow.)
        p.wait("!!document.querySelector('#plan-changes tr[data-change=\"kv_cache_dtype\"]')", 60)
        assert p.text("#plan-changes tr[data-change='kv_cache_dtype']").endswith("→ fp8_e4m3")
        assert p.js("document.getElementById('plan-apply').disabled"), "apply before a dry run"
        # Its cost before the click: the time without service, and why a host cache (not).
        cost = p.text("#plan-downtime")
        assert cost.startswith("Cost: ") and "without service" in cost and "stop" in cost, cost
        host = p.text("#plan-host-cache")
        assert host.startswith(("No host cache: ", "Host cache proposed: ")), host
        if host.startswith("Host cache proposed: "):
            pin = p.text("#plan-lever-costs li[data-lever='enable_hierarchical_cache']")
            assert "start +" in pin and "[sim] pin_s_per_gib" in pin, pin
        p.screenshot(shots / "status-page-kv-bound.png")

        # One click: the dry run of the plan (validate + preflight; nothing stops).
        p.click("#plan-dry-run")
        p.wait("!document.getElementById('plan-apply').disabled", 30, "the plan's dry run")
        assert p.text("#plan-dry-outcome") == "dry run succeeded"
        # Apply asks first; "no" changes nothing.
        p.click("#plan-apply")
        p.wait("document.getElementById('confirm-box').style.display === 'block'", 5)
        confirm = p.text("#confirm-text")
        assert "server restarts" in confirm
        # A lone server is not drained first (docs/router.md): the confirmation says so.
        assert "drained first" not in confirm and "no router in front of this server" in confirm
        assert "requests in flight: SGLang serves on while it drains" in confirm, confirm
        assert "without service" in confirm
        p.click("#confirm-yes")
        # The header shows the apply and its phase, not the server's "ready".
        p.wait(
            "document.getElementById('state').innerText.startsWith('apply · ')",
            20,
            "the apply in the header",
        )
        p.wait(
            f"{STATE} === 'ready' && !document.getElementById('state').innerText.includes('·')", 40
        )
        # The operations list refreshes on its own poll: wait for the apply's row.
        p.wait(
            "[...document.querySelectorAll('#operations tbody tr')].some(r => "
            "r.children[1].innerText === 'apply' && r.children[2].innerText === 'succeeded')",
            20,
            "the apply's row: succeeded",
        )
        assert outcome_row(p)[:2] == ("apply", "succeeded")
        diff = p.js(
            "[...document.querySelectorAll('#operations tbody tr')]"
            ".find(r => r.children[1].innerText === 'apply').children[5].innerText"
        )
        assert "kv_cache_dtype (unset) → fp8_e4m3" in diff, diff
        assert "mem_fraction_static 0.85 → 0.928" in diff, diff
        # The row says how long it was without service, measured, and what it expected.
        down = p.js(
            "[...document.querySelectorAll('#operations tbody tr')]"
            ".find(r => r.children[1].innerText === 'apply').children[6].innerText"
        )
        assert re.fullmatch(r"\d+\.\d s \(expected \d+(\.\d+)? s\)", down), down
        # The banner clears once the new levers carry the load (the kind must hold too).
        p.wait(f"{DIAGNOSIS}.dataset.kind === 'not_saturated'", 40, "the banner to clear")
        assert p.js(f"{DIAGNOSIS}.style.display") == "none"
        assert d.status()["levers"]["kv_cache_dtype"] == "fp8_e4m3"
        p.screenshot(shots / "status-page-after-plan.png")

        # Stop asks for a confirmation; "no" leaves the server serving.
        p.click("#do-stop")
        p.wait("document.getElementById('confirm-box').style.display === 'block'", 5)
        assert "Stop the server?" in p.text("#confirm-text")
        p.click("#confirm-no")
        assert d.status()["state"] == "ready" and d.status()["operation"] is None
        # Restart, confirmed: it runs, with its phase in the header, and changes no lever.
        pid = d.status()["server"]["pid"]
        p.click("#do-restart")
        p.wait("document.getElementById('confirm-box').style.display === 'block'", 5)
        p.click("#confirm-yes")
        p.wait(
            "document.querySelector('#operations tbody tr') && "
            "document.querySelector('#operations tbody tr').children[1].innerText === 'restart'"
            " && document.querySelector('#operations tbody tr .outcome').innerText === 'succeeded'",
            30,
            "the confirmed restart",
        )
        assert p.text("#operations tbody tr .leverdiff") == "unchanged"
        assert d.status()["server"]["pid"] != pid
        assert p.exceptions() == []
    finally:
        browser.close()
