"""Keep the supervisor's own probes out of SGLang's access log.

The daemon polls the server it owns: ``/health_generate`` (readiness, liveness, probation),
``/server_info`` (``/get_server_info`` on an older server) and ``/metrics`` (telemetry).
Each request is one uvicorn access line in SGLang's log — at the default intervals about
50,000 lines a day that bury the requests of real clients.

SGLang 0.5.23 has its own filter for this: ``--uvicorn-access-log-exclude-prefixes``
(``srt/arg_groups/fields/observability.py:58-64``, ``nargs="*"``, default empty), applied
to uvicorn's access handler when the HTTP server starts (``set_uvicorn_logging_configs``,
``srt/entrypoints/http_server.py:2914`` -> ``_configure_uvicorn_access_log_filter``,
``srt/utils/common.py:3524``) as ``UvicornAccessLogFilter`` (``srt/utils/common.py:3452``),
which drops a line whose request path starts with any prefix. The supervisor passes it
with the probe paths as a *default*: an operator who sets the lever
``uvicorn_access_log_exclude_prefixes`` (their own list, or ``[]`` to log every request)
gets exactly that instead. A server whose SGLang has no such flag is launched without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sglang_supervisor.sglang.schema import FlagSchema

#: SGLang 0.5.23's flag (dest name).
EXCLUDE_LEVER = "uvicorn_access_log_exclude_prefixes"
#: Every path the daemon requests from the server it owns (``observe/health.py``). A
#: prefix match: ``/metrics`` also hides a Prometheus that scrapes SGLang directly.
PROBE_PATHS = ("/health_generate", "/server_info", "/get_server_info", "/metrics")


def probe_log_flags(levers: Mapping[str, Any], schema: FlagSchema) -> list[str]:
    """``--uvicorn-access-log-exclude-prefixes <probe paths>``, unless the operator set
    the lever or the installed SGLang has no such flag (then nothing)."""
    spec = schema.flags.get(EXCLUDE_LEVER)
    if spec is None or EXCLUDE_LEVER in levers:
        return []
    return [spec.option, *PROBE_PATHS]
