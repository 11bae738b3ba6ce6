"""The status page's drift block (under Levers) in a real headless Chromium: none at
start, then the lever an API apply changed, with the config's value beside the serving
one (tests/cdp.py drives Debian's chromium)."""

from __future__ import annotations

import os

import pytest

from tests.cdp import Browser, find_chromium
from tests.helpers import Daemon

CHROMIUM = find_chromium()
if CHROMIUM is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI: chromium is missing (scripts/test.sh installs it as root)")
    pytest.skip("needs Debian's chromium (scripts/test.sh installs it)", allow_module_level=True)

ROW = "document.querySelector('#drift tr[data-drift=\"mem_fraction_static\"]')"


def test_the_page_shows_drift_from_the_config(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory(gpus=2).start()
    assert CHROMIUM is not None
    browser = Browser(CHROMIUM)
    try:
        p = browser.page()
        p.goto(d.url + "/")
        p.wait("!!document.querySelector('#drift [data-drift=\"none\"]')", 15, "no drift")
        assert 'levers_source = "api"' in p.text("#drift")

        r = d.apply({"mem_fraction_static": 0.8})
        assert r.json()["operation"]["state"] == "succeeded", r.text
        p.wait(f"!!{ROW}", 15, "the drift row")
        cells = p.js(f"[...{ROW}.children].map(c => c.innerText)")
        assert cells == ["mem_fraction_static", "0.85", "0.8"], cells
        assert "sglang-supervisor reconcile" in p.text("#drift")
        assert p.exceptions() == []
    finally:
        browser.close()
