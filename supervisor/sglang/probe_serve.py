"""The resolution probe's warm mode, run *inside the server's interpreter*: ``serve``
imports torch and SGLang once (``_prewarm``), records which environment variables those
imports read (``_recording_env_reads``), says which SGLang answers (``_which_sglang``,
``ENTRY_POINTS``), then answers each request in a fork that may take on another
environment (``_apply_env``).

``sglang_supervisor.sglang.resolution_helper.probe_source`` sends this source after
``resolve_probe.py`` and ``probe_checks.py`` (one ``-c`` program), so it imports nothing
but the standard library (and, lazily, SGLang and transformers).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time: the same -c program (resolution_helper.probe_source)
    from sglang_supervisor.sglang.resolve_probe import _answer, install_device_facts


def _prewarm(gpu: dict[str, Any]) -> None:
    """Import what resolution imports, once, so that each forked request only resolves."""
    import importlib
    import pkgutil

    install_device_facts(gpu)
    import sglang.srt.arg_groups as groups
    import sglang.srt.server_args  # noqa: F401

    for info in pkgutil.walk_packages(groups.__path__, groups.__name__ + "."):
        with contextlib.suppress(Exception):
            importlib.import_module(info.name)
    with contextlib.suppress(Exception):
        import transformers  # noqa: F401
        from transformers import AutoConfig  # noqa: F401


@contextlib.contextmanager
def _recording_env_reads() -> Any:
    """The names of the environment variables read (``os.environ[...]``, ``.get``,
    ``in``, ``os.getenv``) while the block runs: what the imports fixed at import time.
    Left out: reads by SGLang's ``_handle_deprecated_envs`` (a fork re-runs it) and
    whole-environment scans (``os.environ.items()``, ``dict(os.environ)``: every
    variable passes by and the reader keeps those of its own prefix: fsspec's
    ``FSSPEC_``, networkx's ``NETWORKX_``, SGLang's ``SGL_``, the one of these a fork
    may take on)."""
    reads: set[str] = set()
    scanners: set[Any] = set()  # frames that iterate the whole environment
    cls = type(os.environ)
    getitem, contains, keys, iterate = cls.__getitem__, cls.__contains__, cls.keys, cls.__iter__

    def note(key: object) -> None:
        frame = sys._getframe(2)
        if frame.f_code.co_name == "__iter__" or frame in scanners:
            return
        while frame is not None:
            if frame.f_code.co_name == "_handle_deprecated_envs":
                return
            frame = frame.f_back  # type: ignore[assignment]
        reads.add(str(key))

    def rec_getitem(self: Any, key: Any) -> Any:
        note(key)
        return getitem(self, key)

    def rec_contains(self: Any, key: object) -> bool:
        note(key)
        return contains(self, key)

    def rec_keys(self: Any) -> Any:
        scanners.add(sys._getframe(1))
        return keys(self)

    def rec_iter(self: Any) -> Any:
        scanners.add(sys._getframe(1))
        return iterate(self)

    patched = {
        "__getitem__": rec_getitem,
        "__contains__": rec_contains,
        "keys": rec_keys,
        "__iter__": rec_iter,
    }
    originals = {name: cls.__dict__.get(name) for name in patched}
    for name, fn in patched.items():
        setattr(cls, name, fn)
    try:
        yield reads
    finally:
        for name, original in originals.items():
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)
        scanners.clear()


def _apply_env(env: dict[str, str]) -> None:
    """In a fork: take on the request's environment (``putenv`` too, for C readers), and
    re-run what SGLang's ``environ`` module did with it at import (``SGL_`` and deprecated
    names rewritten to their ``SGLANG_`` replacements)."""
    os.environ.clear()
    os.environ.update(env)
    with contextlib.suppress(Exception):
        from sglang.srt import environ

        environ._handle_deprecated_envs()


#: What ``run`` calls in SGLang, by the name it has in 0.5.23.
ENTRY_POINTS = (
    "sglang.srt.plugins.load_plugins",
    "sglang.srt.server_args.prepare_server_args",
    "sglang.srt.server_args.ServerArgs.resolve_once",
    "sglang.srt.server_args.ServerArgs.check_server_args",
)


def _which_sglang() -> dict[str, Any]:
    """The SGLang that answers: its version, where it is, and which of ``ENTRY_POINTS``
    it lacks (another SGLang may have renamed them: then its resolution cannot run)."""
    import importlib

    out: dict[str, Any] = {"version": None, "path": None, "missing": []}
    try:
        import sglang

        out["version"] = getattr(sglang, "__version__", None)
        out["path"] = os.path.dirname(getattr(sglang, "__file__", None) or "") or None
    except Exception as exc:
        out["missing"].append(f"sglang ({type(exc).__name__}: {exc})"[:300])
        return out
    for dotted in ENTRY_POINTS:
        module, _, rest = dotted.partition(".srt.")
        parts = ("srt." + rest).split(".")
        obj: Any = None
        for i in range(len(parts), 0, -1):  # the longest importable module prefix
            try:
                obj = importlib.import_module(".".join([module, *parts[:i]]))
            except ImportError:
                continue
            except Exception:
                break
            for attr in parts[i:]:
                obj = getattr(obj, attr, None)
            break
        if obj is None:
            out["missing"].append(dotted)
    return out


def serve() -> int:
    """Answer one request per stdin line, each in a fork of this warm process.

    The parent imports torch, SGLang and its resolution hooks once (seconds) and never
    resolves anything itself; a fork answers a request from that pristine state and
    exits. The READY line lists the environment variables the imports read (the
    supervisor forks a request with another environment only where they all agree); a
    request's ``env``, when given, is applied in the fork. Ends at EOF on stdin (the
    supervisor exited or closed the pipe).
    """
    hello = json.loads(sys.stdin.readline())
    with _recording_env_reads() as reads:
        _prewarm(hello["gpu"])
    ready = {"import_env_reads": sorted(reads), "sglang": _which_sglang()}
    sys.stdout.write("@@READY@@" + json.dumps(ready) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        request = json.loads(line)
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            if request.get("env") is not None:
                _apply_env(request["env"])
            result = _answer({**request, "gpu": hello["gpu"]})
            with os.fdopen(write_fd, "w") as w:
                w.write(json.dumps(result))
            os._exit(0)
        os.close(write_fd)
        with os.fdopen(read_fd) as r:
            text = r.read()
        os.waitpid(pid, 0)
        if not text:
            text = json.dumps({"error": "the resolving process died without an answer"})
        sys.stdout.write("@@RESOLVE@@" + text.replace("\n", " ") + "\n")
        sys.stdout.flush()
    return 0
