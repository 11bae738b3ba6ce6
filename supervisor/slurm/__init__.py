"""Servers that span several hosts, with Slurm as the engine (docs/design.md "Servers that
span several hosts").

The daemon runs inside a Slurm allocation and owns the server as ONE job step, one task
per node; we write no coordinator of our own. Modules:

* ``settings`` — the ``[slurm]`` table and the one rule for the node levers (``nnodes``
  is a lever, ``node_rank`` and ``dist_init_addr`` are ours);
* ``allocation`` — the allocation the daemon runs in (job id, nodes, the first node's
  address), refused clearly when there is none;
* ``task`` — what each task of the step runs on its node: renders ``--node-rank`` and
  narrows the managed GPUs to the node's own, then execs the server;
* ``nodeprobe`` — the small per-node probe run through ``srun --overlap``: GPUs (NVML or
  simulated), our tagged members, foreign processes; signals the leader; sweeps leftovers;
* ``probe`` — a ``GpuProbe`` merging every node's answer (GPUs numbered node by node);
* ``launcher`` — the ``ProcessOps`` that launches, finds and tears down the step.

A launcher beside ``host``'s local one (launchers belong in ``host/``; this one is a
package of its own: a launcher, a per-node probe and its settings and rule together).
May import: the shared vocabulary (top level), ``host``, ``sim`` (a node's simulated
GPUs, for the simulated backend). ``config`` imports its
``settings`` (the ``[slurm]`` table); ``engine`` its node rule; ``runtime`` its launcher.
"""
