"""The lever names a shell completes after ``--set`` / ``--unset``, written into the
completion script when it is generated (and printed by ``sglang-supervisor completion
--lever-names``): the daemon's own schema
(``GET /levers/schema``: the flags of the SGLang it runs), else, when the daemon cannot be
asked quickly, the schema bundled with this package. The flags the supervisor owns
(``--host``, ``--port``...) are left out: a lever may not set them.
"""

from __future__ import annotations

import re

from sglang_supervisor_api.cli.client import Client
from sglang_supervisor_api.cli.client_errors import ClientError
from sglang_supervisor_api.cli.daemon_address import resolve_address

#: A TAB must not hang on a daemon that does not answer.
CONNECT_TIMEOUT_S = 0.5
TIMEOUT_S = 2.0
#: What a lever name may be (SGLang's dest names are Python identifiers). The shells
#: expand what they complete from (bash's ``compgen -W`` runs a ``$(...)`` in it), so a
#: name from the daemon that is anything else is dropped, never printed.
_NAME = re.compile(r"[a-z][a-z0-9_]{0,127}")


def _from_daemon() -> list[str]:
    """The dest names of the daemon's schema (found as every client command finds it).
    Raises ``ClientError`` when it cannot be asked."""
    address = resolve_address(None)
    with Client(
        address.url,
        token=address.token,
        cacert=address.cacert,
        timeout_s=TIMEOUT_S,
        connect_timeout_s=CONNECT_TIMEOUT_S,
    ) as client:
        flags = client.schema().get("flags") or []
    names = (str(f["dest"]) for f in flags if isinstance(f, dict) and f.get("dest"))
    return [name for name in names if _NAME.fullmatch(name)]


def _bundled() -> list[str]:
    from sglang_supervisor.sglang.schema import load_bundled

    return list(load_bundled().flags)


def lever_names() -> tuple[list[str], str]:
    """The names (sorted, the supervisor's own flags left out) and where they came from:
    ``daemon`` or ``bundled``."""
    from sglang_supervisor.sglang.levers import OWNED_FLAGS

    try:
        names, source = _from_daemon(), "daemon"
    except ClientError:
        names = []
    if not names:
        names, source = _bundled(), "bundled"
    return sorted(set(names) - set(OWNED_FLAGS)), source
