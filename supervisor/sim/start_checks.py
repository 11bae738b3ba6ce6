"""What the simulated launcher checks before it loads: every rank's GPU visible
(``check_gpus``), and the failures SGLang's start-up would hit (``check_start_faults``:
an injected crash, CUDA-graph capture out of memory, no room for the KV cache). Each
raises ``ServerFailure`` with the lines the launcher logs.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from sglang_supervisor.sim import capacity
from sglang_supervisor.sim.children import ServerFailure
from sglang_supervisor.sim.faults import crash_report
from sglang_supervisor.sim.gpus import sim_gpu_index

if TYPE_CHECKING:
    from sglang_supervisor.sim.lifecycle import Launcher


def check_gpus(launcher: Launcher) -> None:
    """Every rank needs its own visible GPU, as SGLang's ranks do."""
    cfg, visible = launcher.cfg, launcher.env.visible_gpus
    last = cfg.layout.gpus_needed - 1
    unknown = [g for g in visible if sim_gpu_index(g) is None]
    if unknown:
        raise ServerFailure(
            [
                f"RuntimeError: CUDA error: invalid device ordinal: CUDA_VISIBLE_DEVICES "
                f"names {', '.join(unknown)}, which is not a simulated GPU"
            ]
        )
    if not visible or last >= len(visible):
        raise ServerFailure(
            [
                f"RuntimeError: {cfg.num_ranks} ranks (tp_size={cfg.tp_size} × "
                f"dp_size={cfg.dp_size} × pp_size={cfg.pp_size}) need GPU ids up to "
                f"{last} (base_gpu_id={cfg.base_gpu_id}, gpu_id_step={cfg.gpu_id_step}), "
                f"but only {len(visible)} GPUs are visible "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})"
            ]
        )


def check_start_faults(launcher: Launcher) -> None:
    """The start-up failures of SGLang the simulated launcher reproduces, before it loads."""
    if launcher.faults.crash_on_start:
        raise ServerFailure(crash_report(), "TP0")
    if launcher.cfg.cuda_graph:
        capture = capacity.capture_failure(launcher.resolved, launcher.env.memory_bytes)
        if capture is not None:
            raise ServerFailure(capture, "TP0")
    if launcher.max_total_num_tokens <= 0:
        weights_gib = launcher.weight_bytes / 2**30
        raise ServerFailure(
            [
                f"RuntimeError: Not enough memory. Please try to increase "
                f"--mem-fraction-static. (weights {weights_gib:.1f} GiB per rank leave no "
                f"room for the KV cache at mem_fraction_static={launcher.mem_fraction:.3f})"
            ],
            "TP0",
        )
