"""Checks of path- and JSON-valued levers and of the model's config, run *inside the
server's interpreter* as part of SGLang's resolution probe (the stand-in configs for a
model whose config is not here, and the lever a refusal is about:
``probe_standins.py``).

``sglang_supervisor.sglang.resolution_helper`` sends this source with ``resolve_probe.py`` (one
``-c`` program), so it imports nothing but the standard library (and, lazily, SGLang and
huggingface_hub, which the server's environment has). Relative paths resolve against the
server's working directory and ``HF_HOME``/``HUGGINGFACE_HUB_CACHE`` are the server's:
what is checked is what the server will find. Which levers and kinds: see
``supervisor/sglang/lever_paths.py``.

Without SGLang the daemon imports this module and runs ``check_paths`` itself, with
``base`` the server's working directory (``lever_paths.check_where_the_server_runs``);
SGLang's template registry is then not consulted (the daemon never imports SGLang).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import stat
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time: the same -c program (resolution_helper.probe_source)
    pass

#: A Hugging Face repo id (huggingface_hub's validate_repo_id: ``name`` or
#: ``namespace/name``, letters, digits, ``-_.``; never ``..`` nor a leading ``-``/``.``).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?$")


def _at(value: str, base: str | None) -> str:
    """``value`` as the server opens it: ``~`` expanded, relative to ``base`` (None: this
    process's working directory, the server's own inside the probe)."""
    path = os.path.expanduser(value)
    return path if base is None else os.path.join(base, path)


def is_hub_id(value: str, base: str | None = None) -> bool:
    """Whether ``value`` would be read as a Hugging Face id rather than a local path."""
    if value.startswith(("/", "./", "../", "~")) or os.path.exists(_at(value, base)):
        return False
    return bool(_HUB_ID.match(value)) and ".." not in value


def hub_cache_dir() -> str:
    """The hub cache the server uses (huggingface_hub's constants, from its env)."""
    with contextlib.suppress(Exception):
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    home = os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface"))
    return os.environ.get("HUGGINGFACE_HUB_CACHE", os.path.join(home, "hub"))


def cached_config(repo_id: str) -> str | None:
    """The path of ``repo_id``'s config.json in the local hub cache, or None (never
    downloads)."""
    with contextlib.suppress(Exception):
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(repo_id, "config.json")
        if isinstance(hit, str):
            return hit
    return None


def _rel(value: str, base: str | None) -> str:
    if os.path.isabs(os.path.expanduser(value)):
        return ""
    return f" (relative to the server's working directory {base or os.getcwd()})"


#: What a directory of a kind must hold, and how a refusal says it lacks it.
_MARKERS = {
    "model": ("config.json", "a config.json: not a model"),
    "lora": ("adapter_config.json", "an adapter_config.json: not a LoRA adapter"),
}


#: What a path that is neither a regular file nor a directory is (``os.stat``'s mode).
_SPECIAL = (
    (stat.S_ISFIFO, "a FIFO (a named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _special(lever: str, value: str, path: str, base: str | None) -> str | None:
    """Why ``path`` (which exists) is no file to read, or None: a FIFO blocks its reader
    until a writer comes, a device reads without end (``/dev/zero``). Only ``stat``: never
    opened."""
    with contextlib.suppress(OSError):
        mode = os.stat(path).st_mode
        for test, what in _SPECIAL:
            if test(mode):
                return (
                    f"{lever} {value!r} is {what}, not a file or directory: the server "
                    f"would block on it or read it without end{_rel(value, base)}"
                )
    return None


def _local(lever: str, value: str, kind: str, base: str | None) -> str | None:
    """Why ``value`` of ``lever`` cannot be read as a local path of ``kind``, or None."""
    path = _at(value, base)
    if not os.path.exists(path):
        return f"{lever} {value!r} does not exist{_rel(value, base)}"
    special = _special(lever, value, path, base)
    if special is not None:
        return special
    if kind == "file" and not os.path.isfile(path):
        return f"{lever} {value!r} is not a file{_rel(value, base)}"
    if kind == "dir" and not os.path.isdir(path):
        return f"{lever} {value!r} is not a directory{_rel(value, base)}"
    marker, lacks = _MARKERS.get(kind, ("", ""))
    if marker and os.path.isdir(path) and not os.path.isfile(os.path.join(path, marker)):
        return f"{lever} {value!r} is a directory without {lacks}"
    if not os.access(path, os.R_OK):
        return f"{lever} {value!r} is not readable by the server's user"
    return None


def _json(lever: str, value: str) -> str | None:
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        return f"{lever} is not valid JSON ({exc}): {value[:80]!r}"
    if not isinstance(parsed, dict):
        return f"{lever} must be a JSON object, not {type(parsed).__name__}: {value[:80]!r}"
    return None


def _template_known(value: str, kind: str) -> bool | None:
    """Whether SGLang has ``value`` built in (None: its template registry cannot be
    imported in this environment)."""
    try:
        if kind == "completion_template":
            from sglang.srt.parser.code_completion_parser import completion_template_exists

            return bool(completion_template_exists(value))
        from sglang.srt.parser.conversation import chat_template_exists

        if chat_template_exists(value):
            return True
        from sglang.srt.parser.python_chat_template import get_python_chat_template

        return get_python_chat_template(value) is not None
    except Exception:
        return None


def _template(lever: str, value: str, kind: str, base: str | None) -> str | None:
    # SGLang: a built-in name first, then a Python template (chat only), then a file
    # (sglang/srt/parser/template_manager.py:234-247 and :275-280).
    path = _at(value, base)
    if os.path.exists(path):
        if os.path.isfile(path):
            return None
        special = _special(lever, value, path, base)
        return special or f"{lever} {value!r} is not a file{_rel(value, base)}"
    known = None if base is not None else _template_known(value, kind)
    if known is None:
        # Without SGLang's registry only a value that can be nothing but a path is judged.
        pathlike = os.sep in value or value.endswith((".jinja", ".json", ".py"))
        known = not pathlike
    if known:
        return None
    return (
        f"{lever} {value!r} is neither a template SGLang has built in nor an existing "
        f"file{_rel(value, base)}"
    )


def _lora_items(value: Any) -> list[str]:
    """The adapter paths of ``--lora-paths`` as SGLang parsed it (lora_hook.py:76-128)."""
    items = value.values() if isinstance(value, dict) else value or []
    out: list[str] = []
    for item in items:
        if isinstance(item, str) and item.lstrip().startswith("{"):
            with contextlib.suppress(ValueError):  # unparsed (no SGLang): its JSON form
                item = json.loads(item)
        if isinstance(item, dict):
            out.append(str(item.get("lora_path", "")))
        elif isinstance(item, str):
            out.append(item.split("=", 1)[1] if "=" in item else item)
    return out


def _this_host(lever: str, value: str) -> str | None:
    """Why ``host:port`` is not an address of this host, or None. The server starts on
    this host alone; SGLang's ranks meet at ``dist_init_addr`` (torch.distributed's
    store, ``distributed/bootstrap.py:241-243``; with attention DP its ZMQ sockets too,
    ``server_args.py:819-826``): elsewhere, they wait for a peer that never answers."""
    host = value.rpartition(":")[0].strip("[]")  # the form: lever_limits.port_problems
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        return f"{lever} {value!r}: {host!r} does not resolve on the server's host ({exc})"
    for family, _, _, _, address in found:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((address[0], 0))
            except OSError:
                continue
            return None  # an address of this host: it binds
    return (
        f"{lever} {value!r}: {host} is not an address of this host, where the server "
        "starts alone: its ranks would wait at that address for a peer that never answers "
        "(SGLang meets on 127.0.0.1 at nccl_port when dist_init_addr is unset)"
    )


def check_value(lever: str, kind: str, value: Any, base: str | None = None) -> list[str]:
    """Why ``value`` of ``lever`` (a ``kind`` of lever_paths) can never be read, relative
    paths against ``base`` (None: this process's working directory)."""
    if value is None or value == "" or value == []:
        return []
    if kind == "lora":
        items = _lora_items(value)
        return [m for p in items for m in check_value(lever, "lora_path", p, base)]
    text = str(value)
    if kind == "this_host":
        problem = _this_host(lever, text)
        return [problem] if problem else []
    if kind in ("json", "json_or_file", "json_or_at_file"):
        if kind == "json_or_at_file" and text.startswith("@"):
            problem = _local(lever, text[1:], "file", base)
        elif kind == "json" or text.lstrip().startswith("{"):
            problem = _json(lever, text)
        else:
            problem = _local(lever, text, "file", base)
        return [problem] if problem else []
    if kind in ("chat_template", "completion_template"):
        problem = _template(lever, text, kind, base)
        return [problem] if problem else []
    if "://" in text:
        return []  # a remote URI (s3://, gs://...): SGLang's loaders read it
    if kind in ("model", "local_or_hub", "lora_path") and is_hub_id(text, base):
        return []  # a Hugging Face id: not a path (the model's config: see model_config)
    problem = _local(lever, text, "lora" if kind == "lora_path" else kind, base)
    return [problem] if problem else []


def check_paths(
    args: Any, kinds: Mapping[str, str], base: str | None = None
) -> list[dict[str, str]]:
    """``[{lever, message}]`` for each path- or JSON-valued lever of the parsed ``args``
    that can never be read where the server runs (its working directory: ``base``, or
    this process's own when None)."""
    out: list[dict[str, str]] = []
    for lever, kind in sorted(kinds.items()):
        for message in check_value(lever, kind, getattr(args, lever, None), base):
            out.append({"lever": lever, "message": message + f"; fix {lever}"})
    return out


def model_unreachable(model_path: str) -> str | None:
    """None when the model's config can be read without a network, else why not."""
    if model_path.lower() in ("none", "dummy"):
        return None
    if os.path.isdir(model_path):
        if os.path.exists(os.path.join(model_path, "config.json")):
            return None
        return f"{model_path} has no config.json"
    if os.path.exists(model_path):  # a single file (GGUF...): SGLang reads it itself
        return None
    if cached_config(model_path) is not None:
        return None
    return (
        f"model_path {model_path!r} is a Hugging Face id whose config is not in the local "
        f"hub cache ({hub_cache_dir()}; the probe never downloads)"
    )
