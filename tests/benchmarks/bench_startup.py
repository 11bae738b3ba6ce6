"""Start-up: how soon a new daemon answers, and its first validation in a new lever
environment (issue 20 §5).

A real daemon (``serve --simulate``, 8 simulated GPUs, production timeouts) whose
``server.python`` is the SGLang environment (``.venv-sglang``; the daemon's own
interpreter, without SGLang, when it is missing) and whose state directory is new (no
cached flag schema: start-up imports SGLang to read it). Per run, from the spawn:

* the first ``/healthz`` 200 (goal ≤ 1 s), and what ``/status`` said was still loading;
* start-up done (``loading`` null: state, schema and GPUs read; mutating calls answer 503
  until then);
* once the server is ready and the resolution helper has imported SGLang ("the daemon is
  up"), a dry-run apply with the current environment and one with an env lever never seen
  before (``SGLANG_BENCH_NEW_ENV``): the first validation in a new environment
  (goal ≤ 2 s; before the forking helper, a new helper imported SGLang for it).

Runs against older code too (no ``loading``/``sglang`` fields: start-up done is then the
first answer), for before/after figures: run it from an export of that commit.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.benchmarks.common import DEFAULT_TIMEOUTS, Context, Result, Table, summary
from tests.helpers import Daemon, wait_until

NAME = "startup"
HEALTH_GOAL_S = 1.0
NEW_ENV_GOAL_S = 2.0
ROOT = Path(__file__).resolve().parents[2]
LLAMA_8B = str(ROOT / "tests" / "data" / "models" / "llama-3.1-8b")


def _sglang_python() -> str:
    import os

    path = os.environ.get(
        "SGLANG_SUPERVISOR_TEST_SGLANG_PYTHON", str(ROOT / ".venv-sglang" / "bin" / "python")
    )
    return path if Path(path).exists() else sys.executable


def _one(ctx: Context, i: int, python: str) -> dict[str, Any]:
    d = Daemon(
        ctx.subdir(f"startup-{i}"),
        gpus=8,
        levers={"model_path": LLAMA_8B, "tp_size": 8, "mem_fraction_static": 0.85},
        timeouts=DEFAULT_TIMEOUTS,
        sim={"startup_s": 0.0, "host_ram_gib": 512},
        extra={"server": {"python": python}},
    )
    ctx.tags.add(d.instance + ".")
    out: dict[str, Any] = {}
    t0 = time.monotonic()
    d.spawn()
    try:
        first: dict[str, Any] = {}

        def healthz() -> bool:
            assert d.proc is not None and d.proc.poll() is None, d.log()
            try:
                r = d.client.get("/healthz", timeout=1)
            except httpx.HTTPError:
                return False
            if r.status_code == 200:
                first.update(r.json())
                return True
            return False

        wait_until(healthz, 300, 0.01, "/healthz")
        out["healthz_s"] = time.monotonic() - t0
        out["loading_at_first_answer"] = first.get("loading")
        wait_until(lambda: d.client.get("/healthz").json().get("loading") is None, 300, 0.02)
        out["loaded_s"] = time.monotonic() - t0
        d.wait_state("ready", timeout=300)

        def helper_done() -> bool:
            sg = d.status().get("sglang")
            return sg is None or sg.get("validation") != "checking"

        wait_until(helper_done, 300, 0.05, "the SGLang check")
        out["up_s"] = time.monotonic() - t0
        out["sglang"] = d.status().get("sglang")
        for key, env in (("same_env_s", {}), ("new_env_s", {"SGLANG_BENCH_NEW_ENV": str(i)})):
            t = time.monotonic()
            r = d.client.post(
                "/levers",
                params={"wait": "true"},
                json={"levers": {"chunked_prefill_size": 4096}, "env": env, "dry_run": True},
                timeout=300,
            )
            out[key] = time.monotonic() - t
            assert r.status_code == 200, r.text
    finally:
        d.stop(timeout=120)
        d.client.close()
    return out


def run(ctx: Context) -> Result:
    python = _sglang_python()
    reps = ctx.reps(3, 1)
    runs = [_one(ctx, i, python) for i in range(reps)]

    def med(key: str) -> float:
        return float(summary([r[key] for r in runs])["median"])

    def spread(key: str) -> str:
        v = [r[key] for r in runs]
        return f"{min(v):.2f}–{max(v):.2f}"

    rows = [
        ["first /healthz 200 after the spawn", f"{med('healthz_s'):.2f}", spread("healthz_s")],
        ["start-up done (state, schema, GPUs read)", f"{med('loaded_s'):.2f}", spread("loaded_s")],
        ["server ready and SGLang's helper imported", f"{med('up_s'):.2f}", spread("up_s")],
        ["dry-run apply, current env", f"{med('same_env_s'):.2f}", spread("same_env_s")],
        ["dry-run apply, an env lever never seen", f"{med('new_env_s'):.2f}", spread("new_env_s")],
    ]
    table = Table(
        f"Daemon start-up and first validation in a new environment, {reps} runs (s)",
        ["quantity", "median", "min–max"],
        rows,
        note=f"server.python: {python}; loading at the first answer: "
        f"{runs[0].get('loading_at_first_answer')!r}",
    )
    health_ok = med("healthz_s") <= HEALTH_GOAL_S
    env_ok = med("new_env_s") <= NEW_ENV_GOAL_S
    return Result(
        name=NAME,
        title="Start-up: first answer and first validation in a new environment",
        goal=f"/healthz ≤ {HEALTH_GOAL_S:g} s after the spawn; first validation in a new "
        f"environment ≤ {NEW_ENV_GOAL_S:g} s once the daemon is up",
        tables=[table],
        data={"runs": runs, "python": python},
        findings=[
            f"/healthz answered {med('healthz_s'):.2f} s after the spawn (start-up done at "
            f"{med('loaded_s'):.2f} s); a new lever environment validated in "
            f"{med('new_env_s'):.2f} s (same environment {med('same_env_s'):.2f} s)"
        ],
        verdict="met" if health_ok and env_ok else "missed",
    )


if __name__ == "__main__":
    import tempfile

    ctx = Context(quick="--quick" in sys.argv, work=Path(tempfile.mkdtemp(prefix="sgs-bench-")))
    result = run(ctx)
    for t in result.tables:
        print(t.text())
    print("\n".join(result.findings), "->", result.verdict)
