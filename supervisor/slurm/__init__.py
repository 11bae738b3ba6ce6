"""Servers that span several hosts, with Slurm as the engine (docs/slurm.md).

The daemon runs inside a Slurm allocation and owns the server as ONE job step, one task
per node, beside ONE long-lived step of its own on every node (the presence); we write no
coordinator of our own. Modules:

* ``settings`` — the ``[slurm]`` table and the one rule for the node levers (``nnodes``
  is a lever, ``node_rank`` and ``dist_init_addr`` are ours);
* ``allocation`` — the allocation the daemon runs in (job id, nodes, the first node's
  address), refused clearly when there is none;
* ``task`` — what each task of the server's step runs on its node: renders
  ``--node-rank`` and narrows the managed GPUs to the node's own, then execs the server;
* ``nodeprobe`` — the questions a node answers: GPUs (NVML or simulated), our tagged
  members, a port's holders; signals the leader; sweeps leftovers;
* ``agent`` — the presence's task on each node: samples its node, answers questions
  from stdin (``nodeprobe``'s), for the allocation's life;
* ``presence`` — the daemon's side of it: one step, restarted if it dies, questions over
  Slurm's own I/O forwarding, the last samples for readers that must not wait;
* ``probe`` — a ``GpuProbe`` merging every node's answer (GPUs numbered node by node);
* ``step``, ``stop``, ``stuck`` — the server's step in hand (its ids, scancel, Slurm's
  refusal), its leader-first stop, and a stuck node of it;
* ``launcher`` — the ``ProcessOps`` that launches, finds and tears down the step.

A launcher beside ``host``'s local one (a package of its own: a launcher, its per-node
presence, its settings and rule together).
May import: the shared vocabulary (top level), ``host``, ``sim`` (a node's simulated
GPUs, for the simulated backend). ``config`` imports its
``settings`` (the ``[slurm]`` table); ``engine`` its node rule; ``runtime`` its launcher.
"""
