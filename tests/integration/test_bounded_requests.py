"""Bounded resources and honest answers, through one real ``serve --simulate`` daemon over
HTTP (issue 27 §6): ``GET /logs`` and a link planted in ``<state>/logs/``, a duplicate
JSON key, ``POST /plan`` on a huge or deeply nested ``config.json``, and many
connections holding their bodies. Each answer is a clear 4xx (or the real log), and the
server's pid, state and levers are unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("bounded"), gpus=2).start()
    yield d
    assert d.stop() == 0, d.log()
    d.client.close()


def _unchanged(d: Daemon, before: dict[str, Any]) -> None:
    after = d.status()
    assert after["server"]["pid"] == before["server"]["pid"], "the server was restarted"
    assert after["state"] == "ready" and after["operation"] is None
    assert after["levers"] == before["levers"]


def test_logs_never_follow_a_link_planted_in_the_logs_dir(daemon: Daemon, tmp_path: Path) -> None:
    """A link named as the newest launch's log (``server-9...`` sorts after every real
    one) made ``GET /logs`` serve the file it points to — as root, any file."""
    victim = tmp_path / "shadow"
    victim.write_text("root:$6$secret-hash:19000:0:99999:7:::\n")
    logs = Path(daemon.status()["server"]["log_path"]).parent
    planted = [logs / "server-99999999-000000.000000-planted.log", logs / "server-0.log"]
    for link in planted:
        link.symlink_to(victim)
    try:
        for launch in (0, 1):
            r = daemon.client.get("/logs", params={"launch": launch, "tail": 100})
            assert "secret-hash" not in r.text, (launch, r.text)
        newest = daemon.client.get("/logs", params={"tail": 1000})
        assert newest.status_code == 200 and "server_args=" in newest.text
        assert newest.headers["x-log-path"] == daemon.status()["server"]["log_path"]
    finally:
        for link in planted:
            link.unlink()
