#!/usr/bin/env python3
"""Regenerate the bundled SGLang flag schema from a real SGLang installation.

    python scripts/gen_schema.py /path/to/sglang-env/bin/python

runs ``supervisor/sglang/schema_probe.py`` in that interpreter (SGLang's own parser, built by
``ServerArgs.add_cli_args``) and writes ``supervisor/data/sglang-<version>.json``. Only
the parser is needed: ``pip install --no-deps sglang==X`` plus its import-time
dependencies (see ``scripts/sglang-parser-env.sh``) is enough on a machine with no GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    python = sys.argv[1]
    probe = ROOT / "supervisor" / "sglang" / "schema_probe.py"
    out = subprocess.run(
        [python, "-I", str(probe)], capture_output=True, text=True, timeout=300, check=False
    )
    if out.returncode != 0:
        print(
            f"{python} could not describe SGLang's flags (exit {out.returncode}):", file=sys.stderr
        )
        print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
        return 1
    data = json.loads(out.stdout)
    dest = ROOT / "supervisor" / "data" / f"sglang-{data['sglang_version']}.json"
    dest.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    count, version = len(data["flags"]), data["sglang_version"]
    print(f"wrote {dest.relative_to(ROOT)}: {count} flags of SGLang {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
