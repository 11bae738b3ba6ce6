"""The engine's router steps with a fake router: what the router lists around a recovery,
a stop and a start, and that a router that does not answer never holds up a stop."""

from __future__ import annotations

from pathlib import Path

from sglang_supervisor.phases import OpKind
from sglang_supervisor.sglang.router import RouterError
from tests.unit.engine.common import S, apply, idle, ops_of, settle
from tests.unit.fakes import make_rig, run, until


class FakeRouter:
    """A router's worker list for one server; ``down`` makes every call fail."""

    enabled = True
    worker_url = "http://127.0.0.1:30000"

    def __init__(self) -> None:
        self.listed = False
        self.down = False
        #: Reachable, but answers what no sglang-router would (a worker list is missing).
        self.garbage = False
        self.registered: bool | None = None

    async def leave(self) -> str:
        if self.down or self.garbage:
            raise RouterError("router unreachable: DELETE http://router/workers/x failed")
        self.listed = False
        self.registered = False
        return "removed"

    async def join(self) -> str:
        if self.down or self.garbage:
            raise RouterError("router unreachable: POST http://router/workers failed")
        self.listed = True
        self.registered = True
        return "listed healthy"

    async def check(self) -> str:
        if self.down or self.garbage:
            what = "answered 200 with HTML, not a worker list" if self.garbage else "unreachable"
            raise RouterError(f"router http://router: GET http://router/workers {what}")
        return "answers"

    async def aclose(self) -> None:
        return None


def test_a_hung_server_leaves_the_router_before_its_teardown(tmp_path: Path) -> None:
    router = FakeRouter()
    rig = make_rig(tmp_path, router=router)
    listed_at_teardown: list[bool] = []
    teardown = rig.procs.teardown

    def watched(*args: object, **kw: object) -> object:
        listed_at_teardown.append(router.listed)
        return teardown(*args, **kw)  # type: ignore[arg-type]

    rig.procs.teardown = watched  # type: ignore[method-assign]

    async def main() -> None:
        await rig.start_ready()
        assert router.listed  # registered at start
        rig.procs.handles[0].hung = True
        await until(lambda: rig.sup.restarts == 1 and idle(rig, S.READY))
        (recover,) = ops_of(rig, OpKind.RECOVER)
        names = [p.name for p in recover.phases]
        assert names.index("router_remove") < names.index("stop")
        assert names.index("start") < names.index("router_add")
        assert listed_at_teardown == [False]
        assert router.listed  # the new server is back in
        await rig.sup.shutdown()
        assert not router.listed  # the daemon's exit takes it out

    run(main)


def test_stop_keeps_it_out_and_start_puts_it_back(tmp_path: Path) -> None:
    router = FakeRouter()
    rig = make_rig(tmp_path, router=router)

    async def main() -> None:
        await rig.start_ready()
        op = await settle(rig, rig.sup.submit_stop())
        assert op.state == "succeeded"
        assert not router.listed and rig.sup.view().router is not None
        assert [p.name for p in op.phases][:2] == ["router_remove", "drain"]
        op = await settle(rig, await rig.sup.submit_start())
        assert op.state == "succeeded" and router.listed
        await rig.sup.shutdown()

    run(main)


def test_a_router_that_does_not_answer_never_holds_up_a_crash_recovery(tmp_path: Path) -> None:
    router = FakeRouter()
    rig = make_rig(tmp_path, router=router)

    async def main() -> None:
        await rig.start_ready()
        router.down = True
        rig.procs.crash(rig.procs.handles[0])
        await until(lambda: rig.sup.restarts == 1 and idle(rig, S.READY))
        (recover,) = ops_of(rig, OpKind.RECOVER)
        failed = {p.name: p.detail for p in recover.phases if p.state == "failed"}
        assert set(failed) == {"router_remove", "router_add"}
        assert "stopping anyway" in failed["router_remove"]
        view = rig.sup.view()
        assert view.router is not None
        assert "router unreachable: POST" in str(view.router["error"])
        await rig.sup.shutdown()

    run(main)


def test_an_unexpected_error_after_the_stop_puts_the_last_good_server_back_in(
    tmp_path: Path,
) -> None:
    """Popen raised a non-OSError after the apply had taken the server out of the router:
    the containment starts the last-good levers again, and they serve in the router too
    (not left serving where no client behind the router can reach it)."""
    router = FakeRouter()
    rig = make_rig(tmp_path, router=router)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.spawn_error = UnicodeEncodeError(
            "utf-8", "\ud800", 0, 1, "surrogates not allowed"
        )
        op = await apply(rig, {"mem_fraction_static": 0.9})
        assert op.state == "rolled_back", op.error
        assert "UnicodeEncodeError" in (op.error or "")
        assert idle(rig, S.READY)
        assert router.listed  # back behind the router
        await rig.sup.shutdown()

    run(main)
