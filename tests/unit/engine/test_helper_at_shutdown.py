"""A resolution helper killed because the daemon closes is not a degraded SGLang (seen on
the H200: the daemon's last line was "SGLang's resolution helper failed ... exit -9")."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor.engine import validation
from sglang_supervisor.engine.sglang_info import CHECKING
from sglang_supervisor.sglang.parser import ParserUnavailable
from tests.unit.fakes import make_rig


class _KilledHelper:
    def which_sglang(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise ParserUnavailable("python could not import SGLang (exit -9): (no output)")


@pytest.mark.parametrize("closing", [True, False])
def test_a_helper_lost_to_the_daemons_stop_is_not_a_degraded_sglang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, closing: bool
) -> None:
    rig = make_rig(tmp_path)
    monkeypatch.setattr(validation, "default_resolver", _KilledHelper)

    async def main() -> None:
        await rig.start_ready()
        rig.sup.record.sglang_learned(replace(rig.sup.sglang, validation=CHECKING))
        if closing:
            rig.sup.stop_request.request()
        await validation.check_sglang(rig.sup.parts, rig.sup.record, rig.sup.stop_request)

    asyncio.run(main())
    if closing:
        assert rig.sup.sglang.validation == CHECKING
        assert not any("helper failed" in w for w in rig.sup.warnings)
    else:  # a helper that dies while the daemon runs is said, as before
        assert rig.sup.sglang.validation == "degraded"
        assert any("helper failed" in w for w in rig.sup.warnings)
