"""Render the end-to-end GPU test's figures (``$SGS_E2E_RESULTS``) as Markdown.

python -m tests.gpu.e2e_report tests/gpu/results/daemon_e2e_h200.json > out.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

PHASES = ("validate", "preflight", "stop", "release", "start", "probation", "commit")
ROLLBACK = ("rollback_stop", "rollback_release", "rollback_start")


def _s(value: Any) -> str:
    return "–" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def render(data: dict[str, Any]) -> str:
    meta, steps = data["meta"], data["steps"]
    out = [f"# Daemon end to end, real mode ({meta['mode']})", ""]
    out.append("GPUs as NVML numbers them, and CUDA's default order (no CUDA_VISIBLE_DEVICES):")
    out.append("")
    for g in meta["gpus_nvml_order"]:
        out.append(f"- NVML {g['index']}: {g['uuid']} ({g['name']}, {g['total'] / 2**30:.1f} GiB)")
    out.append(f"- CUDA order: {', '.join(meta['gpus_cuda_default_order'])}")
    out.append(f"- managed, as configured: {', '.join(meta['managed_as_configured'])}")
    ranks = steps.get("start", {}).get("ranks_cuda_view", [])
    for r in ranks:
        out.append(
            f"- rank {r['rank']}: CUDA device {r['cuda_device']} of "
            f"CUDA_VISIBLE_DEVICES={r['cuda_visible_devices']} -> {r['uuid']}"
        )
    out += ["", "| operation | " + " | ".join(PHASES + ROLLBACK) + " | total s |"]
    out.append("|---" * (len(PHASES) + len(ROLLBACK) + 2) + "|")
    for name in ("apply", "apply_away_from_detached_ignoring", "oom_rolled_back"):
        step = steps.get(name)
        if not step:
            continue
        ph = step.get("phases", {})
        cells = [_s(ph.get(p, {}).get("s")) for p in PHASES + ROLLBACK]
        out.append(f"| {name} | " + " | ".join(cells) + f" | {_s(step.get('duration_s'))} |")
    out += ["", "| step | figure |", "|---|---|"]
    rows = [
        ("start", "ready_s", "daemon start -> ready (s)"),
        ("apply", "release_per_gpu_s", "apply: stop -> GPU at baseline, per GPU (s)"),
        ("apply", "validate_detail", "apply: validate (SGLang's own code in server.python)"),
        ("apply", "stop_detail", "apply: stop"),
        (
            "apply_away_from_detached_ignoring",
            "release_per_gpu_s",
            "away from detached SIGTERM-ignoring ranks: stop -> baseline, per GPU (s)",
        ),
        ("apply_away_from_detached_ignoring", "stop_detail", "... stop"),
        ("oom_rolled_back", "rollback_reason", "OOM at start"),
        ("foreign_on_managed", "restart", "restart with a foreign process on a managed GPU"),
        ("launcher_sigkill", "recovery_s", "launcher SIGKILL -> ready again (s)"),
        ("launcher_sigkill", "release_per_gpu_s", "launcher SIGKILL -> baseline, per GPU (s)"),
        ("daemon_sigkill_adopt", "adopt_to_ready_s", "daemon restart -> adopted, ready (s)"),
        ("daemon_sigterm", "exit_s", "daemon SIGTERM -> exit 0 (s)"),
        ("daemon_sigterm", "used_after", "GPU memory used after (bytes)"),
    ]
    for step, key, label in rows:
        if key in steps.get(step, {}):
            value = steps[step][key]
            text = json.dumps(value) if isinstance(value, (dict, list)) else _s(value)
            out.append(f"| {label} | {text[:600]} |")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    sys.stdout.write(render(json.loads(Path(argv[0]).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
