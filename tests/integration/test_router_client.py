"""sglang_supervisor.sglang.router against the real sglang-router 0.3: add, list healthy, remove,
and the errors an operator reads when the router is away or wants a key."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sglang_supervisor.config import RouterSettings, ServerSettings
from sglang_supervisor.sglang.router import (
    RouterClient,
    RouterError,
    build_link,
    default_worker_url,
)
from tests.integration.test_sim_server import Sims, sims, wait_until
from tests.routerkit import Router, free_port, needs_router, router

__all__ = ["router", "sims"]  # the fixtures

pytestmark = needs_router()


def test_add_lists_healthy_then_remove(router: Router, sims: Sims) -> None:
    sim = sims.start()
    sim.wait_ready()
    worker = f"http://127.0.0.1:{sim.port}"
    settings = RouterSettings(url=router.url, worker_url=worker, healthy_timeout_s=30)
    link = build_link(settings, ServerSettings())

    async def scenario() -> tuple[str, str, str]:
        try:
            joined = await link.join()
            again = await link.join()  # already listed: still fine
            left = await link.leave()
            return joined, again, left
        finally:
            await link.aclose()

    try:
        joined, again, left = asyncio.run(scenario())
    except RouterError as exc:
        raise AssertionError(f"{exc}\nrouter log:\n{router.tail()}") from exc
    assert f"lists {worker} healthy" in joined and f"lists {worker} healthy" in again
    assert left == f"removed {worker} from the router {router.url}"
    assert router.workers() == []

    async def leave_again() -> str:
        try:
            return await link.leave()
        finally:
            await link.aclose()

    link = build_link(settings, ServerSettings())
    assert asyncio.run(leave_again()) == f"{worker} was not in the router {router.url}"


def test_a_router_that_does_not_answer_is_named() -> None:
    url = f"http://127.0.0.1:{free_port()}"

    async def ask() -> None:
        client = RouterClient(url, timeout_s=2)
        try:
            await client.list_workers()
        finally:
            await client.aclose()

    with pytest.raises(RouterError, match=f"router unreachable: GET {url}/workers failed"):
        asyncio.run(ask())


def test_a_router_with_an_api_key_refuses_without_it(tmp_path: Path) -> None:
    router = Router(tmp_path / "router.log", api_key="s3cret")
    try:

        async def ask(key: str | None) -> int:
            client = RouterClient(router.url, api_key=key)
            try:
                return len(await client.list_workers())
            finally:
                await client.aclose()

        with pytest.raises(RouterError, match=r"refused GET .*/workers with 401: set \[router\]"):
            asyncio.run(ask(None))
        assert asyncio.run(ask("s3cret")) == 0
    finally:
        router.stop()


def test_default_worker_url_reads_a_wildcard_host_as_loopback() -> None:
    assert default_worker_url(ServerSettings(host="0.0.0.0", port=30001)) == (
        "http://127.0.0.1:30001"
    )
    assert default_worker_url(ServerSettings(host="gpu-a", port=30000)) == "http://gpu-a:30000"


def test_join_re_adds_a_worker_the_router_marked_unhealthy(tmp_path: Path, sims: Sims) -> None:
    # Quick to mark a dead worker unhealthy, slow (30 s) to trust it again on its own.
    fast = ["--health-check-interval-secs", "1", "--health-failure-threshold", "1"]
    fast += ["--health-success-threshold", "30"]
    router = Router(tmp_path / "router.log", *fast)
    try:
        sim = sims.start()
        sim.wait_ready()
        worker = f"http://127.0.0.1:{sim.port}"
        settings = RouterSettings(url=router.url, worker_url=worker, healthy_timeout_s=8)

        async def join() -> str:
            link = build_link(settings, ServerSettings())
            try:
                return await link.join()
            finally:
                await link.aclose()

        asyncio.run(join())
        sim.proc.kill()  # an unplanned death: nobody took it out of the router
        sim.exited(10)

        def marked_unhealthy() -> bool:
            return [w.get("is_healthy") for w in router.workers()] == [False]

        wait_until(marked_unhealthy, 20, "the router to mark the dead worker unhealthy")
        sims.kill_all()
        again = sims.start(port=sim.port)
        again.wait_ready()
        assert "healthy" in asyncio.run(join())
        assert [w.get("is_healthy") for w in router.workers()] == [True]
    finally:
        router.stop()
