"""sglang-supervisor's core (installed as ``sglang_supervisor``): owns one SGLang server and
changes its launch flags atomically. It knows nothing of HTTP serving and never imports
``sglang_supervisor_api``.

Packages by concern (docs/architecture.md names every module):

- ``engine``: the operations (apply, stop, start, restart, recover), the server in hand,
  start-up and adoption, the ticker, the journal, the read-only view;
- ``sglang``: what we know of SGLang: its flag schema, its parser and resolution pipeline
  run in the server's interpreter, lever sets and their limits, the parallel layout, the
  sglang-router client;
- ``host``: the machine: GPUs (NVML), process trees, the staged teardown, release
  verification, resource preflight, the server's environment, systemd's notify socket;
- ``observe``: Prometheus metrics, the server's telemetry and health probes, events, logs;
- ``planner``: KV-capacity math and lever proposals;
- ``sim``: the embedded default: a simulated SGLang server and simulated GPUs;
- ``slurm``: the launcher for a server that spans hosts: one Slurm job step, per-node
  probes through ``srun --overlap``, the ``[slurm]`` settings and the node-lever rule.

The modules at this level are the vocabulary every package shares and may import: states,
phases, operations, units, config, version, redact, store (the state directory),
diskspace (which disk a path is on, whether it is full). They
import only each other (``store`` also ``sglang.levers``, the lever sets it keeps).
``runtime`` is the composition root: the one module here that imports every package.
"""
