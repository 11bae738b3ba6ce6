"""What each task of the server's job step runs on its node:
``python -m sglang_supervisor.slurm.task -- <server command and flags>``.

It renders this node's share of the launch and then becomes the server (``exec``), so the
task Slurm tracks is the server's own launcher:

* ``--node-rank`` from ``SLURM_NODEID`` (the node's index in the step; the step's first
  node, rank 0, is the allocation's first node, whose address is ``--dist-init-addr``);
* ``CUDA_VISIBLE_DEVICES`` narrowed to this node's managed GPUs: the supervisor names
  every node's GPUs as ``<node>/<uuid>`` (``sglang_supervisor.slurm.probe``), and the entries of
  ``SLURMD_NODENAME`` are kept, without the node.

Exit 2 when Slurm did not say which node this is.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

NODE_SEP = "/"


def node_gpus(value: str, node: str) -> str:
    """The entries of ``CUDA_VISIBLE_DEVICES`` that are ``node``'s, without the node
    (entries naming no node are kept as they are)."""
    out = []
    for entry in value.split(","):
        owner, sep, gpu = entry.partition(NODE_SEP)
        if not sep:
            out.append(entry)
        elif owner == node:
            out.append(gpu)
    return ",".join(out)


def node_argv(argv: Sequence[str], env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The server's argv and environment on this node; raises ``ValueError`` when Slurm's
    node id or name is missing."""
    rank = env.get("SLURM_NODEID", "")
    node = env.get("SLURMD_NODENAME", "")
    if not rank.isdigit() or not node:
        raise ValueError(
            "SLURM_NODEID/SLURMD_NODENAME are not set: sglang_supervisor.slurm.task runs as a task "
            "of the server's job step (srun), never by itself"
        )
    new_env = dict(env)
    if "CUDA_VISIBLE_DEVICES" in env:
        new_env["CUDA_VISIBLE_DEVICES"] = node_gpus(env["CUDA_VISIBLE_DEVICES"], node)
    return [*argv, "--node-rank", rank], new_env


def main(args: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if args is None else args)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(
            "usage: python -m sglang_supervisor.slurm.task -- COMMAND [FLAGS...]", file=sys.stderr
        )
        return 2
    try:
        final, env = node_argv(argv, os.environ)
    except ValueError as exc:
        print(f"sglang_supervisor.slurm.task: {exc}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    os.execvpe(final[0], final, env)  # an argv list, never a shell


if __name__ == "__main__":
    sys.exit(main())
