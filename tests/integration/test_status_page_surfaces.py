"""The status page as an operator meets it after a change that rolled back (issue 27 §8),
in a real headless Chromium at 1400 px (tests/cdp.py drives Debian's chromium) on
``serve --simulate``: the rollback above the fold although the header says ``ready``;
no table wider than its section with a long lever value and a long reason; the degraded
validation line saying each clause once; one time format (24-hour UTC); and the logs of
earlier launches offered (``GET /logs?launch=N``), the failed one's among them."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.cdp import Browser, find_chromium
from tests.helpers import Daemon

CHROMIUM = find_chromium()
if CHROMIUM is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI: chromium is missing (scripts/test.sh installs it as root)")
    pytest.skip("needs Debian's chromium (scripts/test.sh installs it)", allow_module_level=True)

PAGE = Path(__file__).resolve().parents[2] / "api/static/status.html"
#: A value with no place to break: a table cell must wrap it, not grow past its section.
LONG_NAME = "org/" + "averylongservedmodelname" * 8

#: Every table inside a section, and how much wider it is than its section (px).
OVERFLOW = """[...document.querySelectorAll('main section')].flatMap(s =>
  [...s.querySelectorAll('table')].map(t => [t.id || t.parentElement.id,
    Math.round(t.getBoundingClientRect().right - s.getBoundingClientRect().right)])
).filter(([, over]) => over > 0)"""


def test_the_page_after_a_rollback_at_1400_px(daemon_factory: type[Daemon]) -> None:
    levers = {
        "model_path": "sim/llama",
        "tp_size": 2,
        "mem_fraction_static": 0.85,
        "served_model_name": LONG_NAME,
    }
    d = daemon_factory(gpus=2, levers=levers).start()
    op = d.apply({"mem_fraction_static": 0.99}).json()["operation"]  # OOM at start
    assert op["state"] == "rolled_back", op
    assert CHROMIUM is not None
    browser = Browser(CHROMIUM)
    try:
        p = browser.page(width=1400, height=900)
        p.goto(d.url + "/")
        p.wait(
            "!document.querySelector('#last-change').hidden && "
            "document.querySelector('#operations tbody tr') !== null",
            20,
            "the rollback banner and the operations",
        )
        # The header says ready (the last-good levers serve) and, above the fold, why the
        # change did not hold.
        assert p.text("#state") == "ready"
        said = p.text("#last-change")
        assert f"The last change (apply {op['id']}," in said and "rolled back" in said, said
        assert str(op["rollback_reason"])[:40] in said, said
        assert re.search(r", \d\d:\d\d:\d\d UTC\)", said), said
        bottom = p.js("document.querySelector('#last-change').getBoundingClientRect().bottom")
        assert bottom <= p.js("window.innerHeight"), bottom

        # No table wider than its section (the levers' long value, the long reason).
        p.wait(f"document.querySelector('#levers').innerText.includes({LONG_NAME!r})", 10)
        assert p.js(OVERFLOW) == []

        # Validation without SGLang: degraded, each clause once.
        line = p.text("#sglang")
        assert "degraded" in line and line.count("bundled schema") == 1, line

        # One time format: the operations' start times in 24-hour UTC, under a "(UTC)" head.
        assert "started (UTC)" in p.text("#operations thead")
        cells = p.js("[...document.querySelectorAll('#operations td.when')].map(c => c.innerText)")
        assert cells and all(re.fullmatch(r"\d\d:\d\d:\d\d", c) for c in cells), cells

        # The earlier launches' logs: one back is the launch that ran out of memory.
        current = p.text("#log-path")
        p.click("#log-older")
        p.wait(f"document.querySelector('#log-path').innerText !== {current!r}", 10, "launch 1")
        assert p.text("#log-launch") == "1 launch before the current one"
        p.wait("document.querySelector('#log-tail').innerText.includes('out of memory')", 10)
        p.click("#log-newer")
        p.wait(f"document.querySelector('#log-path').innerText === {current!r}", 10, "launch 0")
        assert p.exceptions() == []
    finally:
        browser.close()


def test_no_time_on_the_page_is_in_the_browsers_locale() -> None:
    """The one formatter is ``clock`` (UTC); a time written with the browser's locale
    (``toLocaleTimeString``, ``toLocaleDateString``) would mix in a second format."""
    source = PAGE.read_text()
    assert "function clock(" in source
    assert not re.findall(r"toLocale(Time|Date)String|getHours\(", source)
