"""The machine: GPUs, process trees, and what the OS must give before a start.

Holds the interfaces the engine is driven through (``backend``: ``ProcessOps``,
``ServerHandle``, ``Backend``; ``gpu``: ``GpuProbe`` and release verification), their real
implementations (``nvml``, ``process``: spawn and membership, ``teardown``: the staged
stop), resource checks before anything stops (``preflight``), the environment the server
inherits (``serverenv``) and systemd's notify protocol (``sdnotify``). Every call here may
block: the engine calls it through ``asyncio.to_thread``.
May import: the shared vocabulary (top level), ``sglang`` (lever sets, layout),
``planner`` (model shapes, host-cache sizing). Nothing from ``engine`` or ``observe``.
"""
