"""The page-cache warm-up of an apply (``engine.warmup``): before the stop, the new set's
weight files are read while the old server serves; when they do not fit in the RAM the
new server's host cache leaves, skipped with the numbers."""

from __future__ import annotations

from pathlib import Path

from sglang_supervisor.operations import SUCCEEDED
from sglang_supervisor.units import GiB as GIB
from tests.checkpoints import write_checkpoint
from tests.unit.engine.common import apply, phase_detail
from tests.unit.fakes import make_rig, run


def test_the_weights_are_read_before_the_stop_or_skipped_with_the_reason(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path / "model")
    rig = make_rig(tmp_path / "s", levers={"model_path": str(ckpt), "tp_size": 2})

    async def main() -> None:
        await rig.start_ready()
        op = await apply(rig, {"mem_fraction_static": 0.7})
        assert op.state == SUCCEEDED, op.error
        names = [p.name for p in op.phases]
        assert names[names.index("warmup") + 1] == "stop", names
        assert "of 2 weight files read into the page cache" in phase_detail(op, "warmup")
        # 4 GiB available, 8 GiB kept free: nothing fits.
        rig.sup.parts.backend.simulated_host_ram_bytes = 4 * GIB
        op = await apply(rig, {"mem_fraction_static": 0.75})
        assert op.state == SUCCEEDED, op.error
        detail = phase_detail(op, "warmup")
        assert detail.startswith("skipped: the new weights (0.0 GB in 2 files) do not fit"), detail
        assert "4.3 GB of RAM available (simulated), less a 8 GiB margin leaves 0.0 GB" in detail

    run(main)
