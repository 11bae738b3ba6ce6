"""The embedded default: a simulated SGLang server (``python -m sglang_supervisor.sim.server``)
and simulated GPUs, so the daemon runs and is tested end to end without a GPU.

Its modules run in the simulated server's processes (``server``, ``lifecycle``, ``rank``...)
or in the daemon (``gpus``: the simulated ``GpuProbe``; ``capacity``: model resolution).
May import: the shared vocabulary (top level), ``sglang`` (schema, layout), ``planner``,
``host.gpu`` (the probe interface). Nothing from ``engine`` or ``observe``; only
``runtime`` imports it.
"""
