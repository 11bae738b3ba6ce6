"""A server launched with both of SGLang's keys, through the real daemon and the simulated
server (which answers 401 as SGLang 0.5.23's ``decide_request_auth`` does): the daemon reads
``/server_info`` with the ``api_key`` (a normal route, where the admin key is refused) and
changes a lever live with the ``admin_api_key`` (an admin route, where the api key is
refused)."""

from __future__ import annotations

import httpx

from tests.helpers import Daemon

KEYS = {"api_key": "user-key-for-the-test", "admin_api_key": "admin-key-for-the-test"}


def test_the_daemon_uses_each_key_where_sglang_wants_it(daemon_factory: type[Daemon]) -> None:
    levers = {"model_path": "sim/llama", "tp_size": 2, "mem_fraction_static": 0.85, **KEYS}
    d = daemon_factory(gpus=2, levers=levers).start()
    url = f"http://127.0.0.1:{d.server_port}"
    with httpx.Client(base_url=url, trust_env=False, timeout=10) as srv:

        def info(key: str | None) -> int:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            return srv.get("/server_info", headers=headers).status_code

        # The simulated server holds SGLang's rule: api_key only, on a normal route.
        assert (info(None), info(KEYS["admin_api_key"]), info(KEYS["api_key"])) == (
            401,
            401,
            200,
        )
        body = {"server_args": {"pp_max_micro_batch_size": 4}}
        admin = srv.post(
            "/set_internal_state",
            json=body,
            headers={"Authorization": f"Bearer {KEYS['api_key']}"},
        )
        assert admin.status_code == 401  # the api key is not accepted beside an admin key

    st = d.status()
    pid = st["server"]["pid"]
    # /server_info was read at ready: the pool size is there.
    assert st["server"]["max_total_num_tokens"], st["server"]
    op = d.apply({"log_requests": True, "pp_max_micro_batch_size": 16}).json()["operation"]
    assert op["state"] == "succeeded" and op["path"] == "live", op
    assert d.status()["server"]["pid"] == pid
    verify = next(p for p in op["phases"] if p["name"] == "verify")["detail"]
    assert "/server_info reads" in verify, verify
    # Neither key reaches what the daemon answers or logs (the one redaction rule).
    shown = [
        d.client.get("/status").text,
        d.client.get("/operations").text,
        d.client.get("/logs", params={"tail": 400}).text,
        d.log(),
    ]
    for key in KEYS.values():
        assert not [text for text in shown if key in text], key
