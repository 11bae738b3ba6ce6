"""The server's secret flags in a ``--config`` file, never on its command line.

``/proc/<pid>/cmdline`` is readable by every user of the host: ``--api-key k1`` there is
the key. SGLang 0.5.23 takes any single-valued flag from a YAML file instead
(``--config FILE.yaml``: ``srt/server_args.py:683`` merges it into the arguments before
parsing, ``srt/utils/server_args_config_parser.py``; the command line wins over the
file), and no flag of it reads an environment variable. So a local launch writes the
secret levers (``redact.SECRET_LEVERS``: ``api_key``, ``admin_api_key``,
``ssl_keyfile_password``) into ``<state_dir>/server-secrets.yaml`` (0600, replaced
atomically, never through a planted link; removed when a launch has none) and passes
``--config`` and that path; its other flags stay on the command line. The keys are the
flags' option spellings (``api-key``): SGLang rebuilds ``--<key>`` from each. JSON is
YAML, so the file is written as JSON (no YAML library needed).

The daemon's own validation hands SGLang the same flags on a pipe (never an argv), and
``state.json`` keeps them (0600) to relaunch. What stays visible: under
``server.launcher = "slurm"`` the flags are the job step's command line on every node
(the file would not be on the other nodes), so they are on it as before.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from sglang_supervisor.redact import SECRET_LEVERS
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.sglang.schema import FlagSchema
from sglang_supervisor.store import atomic_write

SECRETS_FILE = "server-secrets.yaml"


def split_secrets(levers: LeverSet) -> tuple[LeverSet, dict[str, str]]:
    """(the levers less the secret ones, the secret ones set: dest -> value)."""
    secret = {k: str(v) for k, v in levers.levers.items() if k in SECRET_LEVERS and v is not None}
    public = {k: v for k, v in levers.levers.items() if k not in secret}
    return LeverSet(public, dict(levers.env)), secret


def config_flags(state_dir: Path, secret: dict[str, str], schema: FlagSchema) -> list[str]:
    """Write ``secret`` to the secrets file and return ``["--config", path]``; with none,
    remove the file (no secret of an earlier launch stays on disk) and return ``[]``.
    Blocking (a worker thread). Raises ``StoreError`` (the disk, named) when it cannot
    be written: the launch then fails before anything is spawned."""
    path = state_dir / SECRETS_FILE
    if not secret:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return []
    data = {schema.flags[dest].option.removeprefix("--"): value for dest, value in secret.items()}
    atomic_write(path, json.dumps(data, sort_keys=True) + "\n")
    return ["--config", str(path)]
