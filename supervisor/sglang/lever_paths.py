"""Which levers name a file, a directory, a model or a JSON document, and what each needs.

SGLang reads these only when it starts (after the running server was stopped), so a
value that names nothing is checked before the stop: the checks themselves run in the
server's interpreter, environment and working directory (``supervisor/sglang/probe_checks.py``,
inside SGLang's resolution probe), where relative paths and ``HF_HOME`` mean what they
will mean to the server.

The list is derived from SGLang's flag schema (a ``str`` flag whose dest ends in
``_path``/``_paths``/``_file``, and that is not an output SGLang writes) and completed by
``EXPLICIT`` where the name does not say it (``chat_template``, ``ssl_ca_certs``, the
JSON-valued levers...). ``tests/unit/test_lever_paths.py`` checks both against SGLang
0.5.23's parser.

Kinds (``probe_checks.check_paths`` implements each):

* ``model``: a local directory with a ``config.json`` (or a single model file, GGUF); a
  Hugging Face id is not a path (its config comes from the local hub cache, §4);
* ``local_or_hub``: a local file or directory that exists, or a Hugging Face id;
* ``file`` / ``dir`` / ``exists``: an existing file / directory / either;
* ``chat_template`` / ``completion_template``: a template name SGLang has built in, or an
  existing file (``sglang/srt/parser/template_manager.py:234-247``, ``:275-280``);
* ``lora``: each adapter as SGLang parses ``--lora-paths`` (``<PATH>``, ``<NAME>=<PATH>``
  or JSON ``{"lora_name", "lora_path"}``; ``arg_groups/argparse_actions.py``,
  ``arg_groups/lora_hook.py:76-112``), each path a local directory with an
  ``adapter_config.json`` or a Hugging Face id;
* ``json``: a JSON object; ``json_or_file``: a JSON object (starts with ``{``) or an
  existing file; ``json_or_at_file``: a JSON object or ``@`` and an existing file;
* ``this_host``: ``host:port`` whose host is an address of the server's host
  (``dist_init_addr``: the server starts on one host).

Every path that exists must be a regular file or a directory: a FIFO or a device
(``/dev/zero``) would block the server or be read without end.

Without SGLang (the embedded default, or a resolution that cannot run),
``check_where_the_server_runs`` runs the same checks in the daemon, against the server's
working directory.
"""

from __future__ import annotations

import os
import re
import threading
import types
from collections.abc import Mapping
from typing import Any

from sglang_supervisor.sglang import probe_checks
from sglang_supervisor.sglang.schema import FlagSchema

#: A hung mount can hold a stat for ever: the checks' bound.
CHECK_TIMEOUT_S = 30.0

#: Derived: a str flag whose dest ends so names a path SGLang reads.
_SUFFIXES = ("_path", "_paths", "_file", "_keyfile", "_certfile")
#: Help text of a path SGLang writes (or creates) rather than reads: never checked.
_OUTPUT = re.compile(r"\b(save|export|write|writing|output|storage)\b", re.IGNORECASE)
_TEXT_TYPES = ("str", "callable:nullable_str")

#: Levers the name does not reveal, or whose kind is not ``exists``.
EXPLICIT: dict[str, str] = {
    "model_path": "model",
    "speculative_draft_model_path": "model",
    "tokenizer_path": "local_or_hub",
    "uno_lora_path": "local_or_hub",
    "speculative_token_map": "local_or_hub",
    "lora_paths": "lora",
    "chat_template": "chat_template",
    "completion_template": "completion_template",
    "ssl_keyfile": "file",
    "ssl_certfile": "file",
    "ssl_ca_certs": "file",
    "quantization_param_path": "file",
    "rl_quant_profile": "file",
    "speculative_adaptive_config": "file",
    "dllm_algorithm_config": "file",
    "msprobe_dump_config": "file",
    "kt_weight_path": "dir",
    "json_model_override_args": "json",
    "hisparse_config": "json",
    "kv_events_config": "json",
    "modelexpress_config": "json",
    "deepep_config": "json_or_file",
    "watermark_config": "json_or_file",
    "hicache_storage_backend_extra_config": "json_or_at_file",
    # Parsed (orjson) only when the weights load: configs/load_config.py:135-137.
    "model_loader_extra_config": "json",
    "dist_init_addr": "this_host",
}
#: Named like a path but not one SGLang reads from this host's disk.
NOT_PATHS = frozenset(
    {
        "fastapi_root_path",  # a URL prefix behind a proxy
        "config",  # owned by the supervisor
    }
)


def path_kinds(schema: FlagSchema) -> dict[str, str]:
    """``{dest: kind}`` of every lever of ``schema`` that names a path or JSON document."""
    out: dict[str, str] = {}
    for dest, spec in schema.flags.items():
        if dest in NOT_PATHS or spec.type not in _TEXT_TYPES:
            continue
        if dest.endswith(_SUFFIXES) and not _OUTPUT.search(spec.help or ""):
            out[dest] = "exists"
    for dest, kind in EXPLICIT.items():
        if dest in schema.flags:
            out[dest] = kind
    return out


class PathChecksUnavailable(RuntimeError):
    """The path checks did not finish (the message says why)."""


#: One check at a time: a check blocked for ever (a stat on a hung mount) holds it, so at
#: most one thread is ever left behind.
_CHECKING = threading.Lock()


def check_where_the_server_runs(
    levers: Mapping[str, Any],
    kinds: Mapping[str, str],
    cwd: str | None,
    timeout_s: float = CHECK_TIMEOUT_S,
) -> list[dict[str, str]]:
    """``[{lever, message}]``: ``probe_checks.check_paths`` of ``levers`` without SGLang,
    run by the daemon itself, relative paths against the server's working directory
    ``cwd`` (None: the daemon's, which the server inherits); ``~`` is the same for both
    (a lever env cannot set ``HOME``). Blocking for up to ``timeout_s`` (call it from a
    worker thread); raises ``PathChecksUnavailable`` when the check does not finish."""
    named = {k: v for k, v in levers.items() if k in kinds}
    if not named:
        return []
    if not _CHECKING.acquire(timeout=timeout_s):
        raise PathChecksUnavailable(
            "an earlier check of the levers' paths is still blocked (a path on a hung "
            "mount?): the server would hang reading it as well"
        )
    base = cwd or os.getcwd()
    found: list[list[dict[str, str]]] = []

    def check() -> None:
        try:
            found.append(probe_checks.check_paths(types.SimpleNamespace(**named), kinds, base))
        finally:
            _CHECKING.release()

    worker = threading.Thread(target=check, name="lever-path-checks", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not found:
        raise PathChecksUnavailable(
            f"the levers' paths were not checked within {timeout_s:g}s (a path on a hung "
            "mount?): the server would hang reading them as well"
        )
    return found[0]
