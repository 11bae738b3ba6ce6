"""Render tests/planner_cases.py into docs/planner.md's table (between its markers).

    .venv/bin/python scripts/planner-table.py          # rewrite the table
    .venv/bin/python scripts/planner-table.py --check  # exit 1 when it is stale

SGLang's figures are the cases' own (SGLang 0.5.23's pipeline and formulas); the
planner's are computed now, so the table shows both and cannot drift from the tests.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sglang_supervisor import planner  # noqa: E402
from tests.planner_cases import CASES, H200, Case, planner_model  # noqa: E402

DOC = ROOT / "docs" / "planner.md"
BEGIN = "<!-- planner-table: begin (scripts/planner-table.py) -->"
END = "<!-- planner-table: end -->"


def _levers(levers: dict[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in levers.items())


def _fraction(value: float) -> str:
    """3 decimals, 4 where SGLang does not round (a vision tower's cut)."""
    return f"{value:.3f}" if round(value, 3) == value else f"{value:.4f}"


def _before(case: Case) -> str:
    if case.before is None:
        return "—"
    fraction, cell, tokens = case.before
    off = (tokens - case.kv_tokens()) / case.kv_tokens()
    return f"{_fraction(fraction)}, {cell:,.1f}, {tokens:,} ({off:+.1%})"


def table() -> str:
    rows = [
        "| Model, levers (8×H200, 143,771 MiB) | fraction SGLang / planner | cell B SGLang / "
        "planner | KV tokens per rank SGLang / planner | planner at 79a70ae: fraction, cell "
        "B, KV tokens (vs SGLang) | SGLang 0.5.23 source |",
        "|---|---|---|---|---|---|",
    ]
    for case in CASES:
        cap = planner.capacity(planner_model(case.model), case.levers, H200, 4096)
        rows.append(
            f"| {case.name} (`{_levers(case.levers)}`) "
            f"| {_fraction(case.fraction)} / {_fraction(cap.mem_fraction_static)} "
            f"| {case.cell:,.1f} / {cap.cell_bytes_exact:,.1f} "
            f"| {case.kv_tokens():,} / {cap.kv_tokens_per_rank:,} "
            f"| {_before(case)} "
            f"| `{case.source}` |"
        )
    return "\n".join(rows)


def render(text: str) -> str:
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main() -> int:
    text = DOC.read_text()
    new = render(text)
    if "--check" in sys.argv[1:]:
        if new != text:
            print("docs/planner.md's table is stale: run scripts/planner-table.py")
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
