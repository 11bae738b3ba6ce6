"""Faults the simulated server injects on request (``SGLANG_SIM_FAULTS``), and the log
text of its failures, shaped like what SGLang and PyTorch print.

``SGLANG_SIM_FAULTS`` is a comma list; faults combine:

* ``crash_on_start`` — after the load delay, log a traceback, kill own children, exit 1;
* ``hang_on_start`` — never become ready (health endpoints answer 503);
* ``ignore_sigterm`` — the launcher and every child ignore SIGTERM (and SIGINT);
* ``crash_after=S`` — S seconds after ready the launcher dies at once (``os._exit(1)``),
  leaving its ranks orphaned and holding memory;
* ``unhealthy_after=S`` — S seconds after ready ``/health_generate`` answers 503;
* ``detach_ranks`` — ranks and the detokenizer call ``setsid()``, escaping the group;
* ``update_weights_fail=N`` — the first N ``/update_weights_from_disk`` calls fail mid-load,
  as SGLang's do (``sglang_supervisor.sim.runtime``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sglang_supervisor.sim import envlist

FAULTS_ENV = "SGLANG_SIM_FAULTS"
_SWITCHES = ("crash_on_start", "hang_on_start", "ignore_sigterm", "detach_ranks")
_TIMED = ("crash_after", "unhealthy_after", "update_weights_fail")


@dataclass(frozen=True)
class Faults:
    crash_on_start: bool = False
    hang_on_start: bool = False
    ignore_sigterm: bool = False
    detach_ranks: bool = False
    #: Seconds after ready; None when not requested.
    crash_after: float | None = None
    unhealthy_after: float | None = None
    #: How many weights updates fail (None: none).
    update_weights_fail: float | None = None

    def crash_due(self, since_ready: float) -> bool:
        """``crash_after`` has come: the launcher dies abruptly, leaving its children."""
        return self.crash_after is not None and since_ready >= self.crash_after

    def unhealthy_due(self, since_ready: float) -> bool:
        """``unhealthy_after`` has come: /health_generate answers 503 from now on."""
        return self.unhealthy_after is not None and since_ready >= self.unhealthy_after


def parse_faults(text: str) -> Faults:
    """Parse a ``SGLANG_SIM_FAULTS`` value. Raises ``ValueError`` naming the bad item."""
    switches: dict[str, bool] = {}
    timed: dict[str, float] = {}
    for item, name, has_value, value in envlist.items(text):
        if name in _SWITCHES and not has_value:
            switches[name] = True
        elif name in _TIMED and has_value:
            seconds = envlist.number(value)
            if not math.isfinite(seconds) or seconds < 0:
                what, unit = (
                    ("a count", "N")
                    if name == "update_weights_fail"
                    else ("a number of seconds", "S")
                )
                raise ValueError(f"{FAULTS_ENV}: {item!r} needs {what} >= 0 ({name}={unit})")
            timed[name] = seconds
        else:
            known = ", ".join([*_SWITCHES, *(f"{t}=S" for t in _TIMED)])
            raise ValueError(f"{FAULTS_ENV}: unknown fault {item!r} (known: {known})")
    return Faults(
        crash_on_start=switches.get("crash_on_start", False),
        hang_on_start=switches.get("hang_on_start", False),
        ignore_sigterm=switches.get("ignore_sigterm", False),
        detach_ranks=switches.get("detach_ranks", False),
        crash_after=timed.get("crash_after"),
        unhealthy_after=timed.get("unhealthy_after"),
        update_weights_fail=timed.get("update_weights_fail"),
    )


def crash_report() -> list[str]:
    """The traceback of the ``crash_on_start`` fault."""
    return [
        "Scheduler hit an exception: Traceback (most recent call last):",
        '  File "sglang/srt/managers/scheduler.py", in run_scheduler_process',
        "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, ...)",
        '  File "sglang/srt/model_executor/model_runner.py", in load_model',
        "    self.model = get_model(model_config=self.model_config, ...)",
        f"RuntimeError: simulated crash while loading the model ({FAULTS_ENV}=crash_on_start)",
    ]
