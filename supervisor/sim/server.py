"""The simulated SGLang server: ``python -m sglang_supervisor.sim.server <SGLang launch flags>``.

A real process tree shaped like SGLang 0.5.23's: this launcher serves SGLang's HTTP
endpoints and logs SGLang-shaped lines; it spawns one ``sglang_supervisor.sim.rank`` child per
rank (tp × dp × pp), each "holding" GPU memory through the simulated-GPU registry, plus a
detokenizer child. The flags are parsed by a parser built from the bundled 0.5.23 schema,
so exactly SGLang's flags are accepted (an unknown one exits 2, as SGLang does).

Environment:

* ``CUDA_VISIBLE_DEVICES`` — comma list of simulated GPU UUIDs (or indices); rank r uses
  entry ``base_gpu_id + r × gpu_id_step``. Unset: the 8 default simulated GPUs.
* ``SGLANG_SIM_GPU_DIR`` (required) — the registry directory of ``SimGpuProbe``.
* ``SGLANG_SIM_GPU_MEMORY_MIB`` (143771), ``SGLANG_SIM_STARTUP_S`` (1.5: the simulated
  model load), ``SGLANG_SIM_FAULTS`` (see ``sglang_supervisor.sim.faults``). Memory runs out where
  SGLang's does (``sglang_supervisor.sim.capacity``): at CUDA-graph capture, or on the first
  prefill that needs more activation memory than ``--mem-fraction-static`` leaves.
* ``SGLANG_SIM_LOAD`` — a synthetic workload, scheduled as SGLang schedules (see
  ``sglang_supervisor.sim.load``).
* ``SGLANG_SIM_MODEL_CONFIG`` — a config.json for the served model when ``--model-path``
  is not a local model directory (see ``sglang_supervisor.sim.capacity``).

The KV pool (``max_total_num_tokens``) is sized by ``sglang_supervisor.planner`` — the same math
as ``POST /plan`` — including SGLang's own default ``mem_fraction_static`` when the flag
is unset.

* ``SGLANG_SIM_TOKENS_PER_S`` (100) — decode steps per second (one token for every
  running request each step), so generations last as long as a real server's;
  ``SGLANG_SIM_PREFILL_TOKENS_PER_S`` (2,000,000) — prompt tokens per second of a prefill
  pass; ``SGLANG_SIM_HEALTH_S`` (1.0) — how long
  /health_generate takes (a one-token generation SGLang polls once a second);
  ``SGLANG_SIM_DRAIN_CHECK_S`` (5.0) — the SIGTERM watchdog's interval.

Endpoints (``sglang_supervisor.sim.http``): ``/generate``, ``/v1/completions``,
``/v1/chat/completions`` (streaming or not, ``sglang_supervisor.sim.generate``), ``/health``,
``/health_generate``, ``/server_info`` (and the deprecated ``/get_server_info``),
``/model_info`` (``/get_model_info``), ``/v1/models``, ``/metrics``.

Signals: SIGTERM or SIGINT as SGLang 0.5.23 handles them — keep serving, drain with no
deadline of its own, then stop the children and exit 0 (``sglang_supervisor.sim.lifecycle``).
Exit 1 on a start-up failure (capture OOM, too few GPUs, a fault, a child that died) or a
prefill's CUDA out of memory.

Modules: ``flags`` (SGLang's flags, the SGLANG_SIM_* environment), ``lifecycle`` (the
launcher), ``children`` (ranks and detokenizer), ``http`` (endpoints), ``generate``
(request and answer formats), ``load`` (the engine), ``metrics`` (/metrics).
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Sequence

from sglang_supervisor.sim import capacity
from sglang_supervisor.sim.flags import ServerConfig, SimEnv, build_parser, log, merge_config
from sglang_supervisor.sim.lifecycle import Launcher

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse SGLang's flags and the simulation's environment, then serve."""
    parser = build_parser()
    try:
        args = merge_config(list(sys.argv[1:] if argv is None else argv))
    except ValueError as exc:
        parser.error(str(exc))  # exits 2, as SGLang's parser would
    ns = parser.parse_args(args)  # exits 2 on error
    if ns.model_path is None:
        parser.error("the following arguments are required: --model-path/--model")
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)  # the ranks share this log
    try:
        env = SimEnv.from_environ(os.environ)
        model = capacity.resolve_model(str(ns.model_path), os.environ)
    except ValueError as exc:  # PlanError is one
        log(f"ERROR: {exc}")
        return 1
    cfg = ServerConfig.from_namespace(ns)
    if (getattr(ns, "nnodes", None) or 1) > 1:
        from sglang_supervisor.sim.nodes import run_node

        return run_node(cfg, env, model)
    return Launcher(cfg, env, model).run()


if __name__ == "__main__":
    sys.exit(main())
