"""The warm resolution helper process: one ``resolve_probe.py --serve`` kept running per
environment (``_Helper``), the ``-c`` program it runs (``probe_source``), and the rule of
which environments a fork of it may take on (``FORK_ENV_PREFIXES``, ``_Helper.takes``).
Everything here blocks: call it from a worker thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sglang_supervisor.sglang.parser import ParserUnavailable

if TYPE_CHECKING:
    from sglang_supervisor.sglang.resolution import GpuFacts

PROBE_SOURCE = Path(__file__).with_name("resolve_probe.py")
#: Checks the probe runs before SGLang's resolution (paths, JSON, the model's config).
CHECKS_SOURCE = Path(__file__).with_name("probe_checks.py")
#: What it does when the model's config is not here, and which lever a refusal is about.
STANDINS_SOURCE = Path(__file__).with_name("probe_standins.py")
#: The probe's warm mode (``--serve``): one import, then a fork per request.
SERVE_SOURCE = Path(__file__).with_name("probe_serve.py")
_READY = "@@READY@@"
_ANSWER = "@@RESOLVE@@"
#: Warm helpers kept at once (one per environment that a fork cannot take on).
MAX_HELPERS = 2
#: Environment variables a fork of a warm helper may take on: SGLang reads its own
#: (``sglang/srt/environ.py``: ``EnvField.get`` reads ``os.environ`` at each call) when
#: it runs, and re-runs its import-time rewrite of ``SGL_``/deprecated names in the fork;
#: NCCL reads its own only when a communicator is created, which the probe never does.
#: Excluded even then: any variable the helper's imports read (its READY line lists
#: them; e.g. ``SGLANG_CACHE_DIR``, ``SGLANG_PLUGINS``, ``SGLANG_USE_CPU_ENGINE`` in
#: 0.5.23). Everything else (``CUDA_*``, ``TORCH*``, ``TRITON_*``, ``HF_*``,
#: ``PYTHON*``, ``LD_*``...) may be read at import, by Python or by C libraries whose
#: reads cannot be seen: a change there starts a fresh helper.
FORK_ENV_PREFIXES = ("SGLANG_", "SGL_", "NCCL_")


def probe_source() -> str:
    """The ``-c`` program: ``resolve_probe.py`` with ``probe_checks.py``,
    ``probe_standins.py`` then ``probe_serve.py`` placed, in that order, before its entry
    point (one program: the server's interpreter cannot import this package)."""
    probe = PROBE_SOURCE.read_text()
    future = "from __future__ import annotations\n"
    checks = CHECKS_SOURCE.read_text().replace(future, "")
    standins = STANDINS_SOURCE.read_text().replace(future, "")
    serve = SERVE_SOURCE.read_text().replace(future, "")
    head, main = probe.rsplit('\nif __name__ == "__main__":', 1)
    return f'{head}\n{checks}\n{standins}\n{serve}\nif __name__ == "__main__":{main}'


class _Helper:
    """One warm ``resolve_probe.py --serve`` process."""

    def __init__(self, python: str, env: Mapping[str, str], cwd: str | None, gpu: GpuFacts) -> None:
        self.lock = threading.Lock()
        self.python = python
        self.env = dict(env)
        self.base = (python, cwd, json.dumps(gpu.to_json(), sort_keys=True))
        #: Variables read while the helper imported (from its READY line; None before).
        self.import_env_reads: frozenset[str] | None = None
        #: Which SGLang it imported: version, path, entry points it lacks (READY line).
        self.sglang: dict[str, Any] | None = None
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the helper
        try:
            self.proc = subprocess.Popen(
                [python, "-c", probe_source(), "--serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise ParserUnavailable(
                f"server.python {python!r} does not exist; point it at the interpreter of "
                "the environment where SGLang is installed"
            ) from exc
        except OSError as exc:
            raise ParserUnavailable(f"server.python {python!r} cannot be run: {exc}") from exc
        self._buf = b""
        self.ready = False
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"gpu": gpu.to_json()}) + "\n").encode())
        self.proc.stdin.flush()

    def _line(self, deadline: float) -> str:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            readable, _, _ = select.select([fd], [], [], left)
            if readable:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise EOFError
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode(errors="replace")

    def _expect(self, marker: str, deadline: float) -> str:
        while True:
            line = self._line(deadline)
            if line.startswith(marker):
                return line[len(marker) :]

    def _wait_ready(self, deadline: float) -> None:
        if self.ready:
            return
        hello = self._expect(_READY, deadline)
        with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
            said = json.loads(hello)
            self.sglang = said.get("sglang")
            self.import_env_reads = frozenset(said["import_env_reads"])
        self.ready = True

    def which_sglang(self, timeout_s: float) -> dict[str, Any]:
        """The READY line's ``sglang``: waits for the helper's imports. Raises
        ``ParserUnavailable`` when it died or did not answer in time."""
        try:
            self._wait_ready(time.monotonic() + timeout_s)
        except TimeoutError as exc:
            self.close()
            raise ParserUnavailable(
                f"{self.python} did not import SGLang within {timeout_s:.0f}s"
            ) from exc
        except EOFError as exc:
            self.close()
            raise ParserUnavailable(
                f"{self.python} could not import SGLang (exit {self.proc.poll()}): "
                f"{self.stderr_tail()}"
            ) from exc
        return dict(self.sglang or {})

    def takes(self, env: Mapping[str, str], timeout_s: float) -> bool:
        """Whether a fork of this helper may answer for ``env`` (``FORK_ENV_PREFIXES``).
        Waits for the helper's imports (its READY line) until ``timeout_s``; False when
        it died or did not say what its imports read. Call it holding ``lock``."""
        try:
            self._wait_ready(time.monotonic() + timeout_s)
        except (TimeoutError, EOFError):
            return False
        if self.import_env_reads is None:
            return False
        changed = {k for k in self.env.keys() | env.keys() if self.env.get(k) != env.get(k)}
        return all(
            k.startswith(FORK_ENV_PREFIXES) and k not in self.import_env_reads for k in changed
        )

    def ask(
        self,
        argv: Sequence[str],
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        paths: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        try:
            self._wait_ready(deadline)
            assert self.proc.stdin is not None
            request: dict[str, Any] = {"argv": list(argv), "paths": dict(paths or {})}
            if env is not None and dict(env) != self.env:
                request["env"] = dict(env)
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
            answer: dict[str, Any] = json.loads(self._expect(_ANSWER, deadline))
            return answer
        except TimeoutError as exc:
            self.close()
            raise ParserUnavailable(
                f"{self.python} did not resolve the levers within {timeout_s:.0f}s"
            ) from exc
        except (EOFError, BrokenPipeError, ValueError) as exc:
            self.close()
            raise ParserUnavailable(
                f"{self.python} could not run SGLang's resolution (exit "
                f"{self.proc.poll()}): {self.stderr_tail()}"
            ) from exc

    def stderr_tail(self, lines: int = 3) -> str:
        try:
            self._stderr.seek(0)
            text = self._stderr.read()[-8192:].decode(errors="replace")
        except (OSError, ValueError):
            return "(no output)"
        tail = [ln for ln in text.splitlines() if ln.strip()][-lines:]
        return " | ".join(tail) or "(no output)"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        for pipe in (self.proc.stdin, self.proc.stdout, self._stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
