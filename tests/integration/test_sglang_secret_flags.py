"""SGLang 0.5.23's own code: the server's secret flags reach it through the ``--config``
file the daemon writes (``host.secretflags``), not its argv, and the line SGLang logs at
start with them (``server_args={...}``, ``srt/entrypoints/engine.py:311``) shows none of
them once through the daemon's one redaction rule."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from sglang_supervisor.host.secretflags import config_flags
from sglang_supervisor.redact import REDACTED, redact_text
from sglang_supervisor.sglang.schema import load_bundled
from tests.sglang_env import ENV, SGLANG_PYTHON, needs_sglang

pytestmark = needs_sglang()

# Runs in SGLang's interpreter: its parser with its --config merger, its resolution, and
# the dict it logs (``_server_args_for_logging``, engine.py:173; engine.py itself needs
# uvloop, which the test environment lacks, so its one line is repeated here).
SCRIPT = """
import json, sys
from sglang.srt.server_args import prepare_server_args
from sglang.srt.sampling.watermarking.core import redact_watermark_secrets

args = prepare_server_args(json.loads(sys.argv[1]))
args.resolve_once()
line = f"server_args={redact_watermark_secrets(args.resolved_dict())}"
print(json.dumps({"api_key": args.api_key, "admin_api_key": args.admin_api_key,
                  "ssl_keyfile_password": args.ssl_keyfile_password, "line": line}))
"""


def test_sglang_takes_the_secret_flags_from_the_file_and_its_print_is_redacted(
    tmp_path: Path,
) -> None:
    secrets = {"api_key": "k1", "admin_api_key": "Qa\"b'c\\d", "ssl_keyfile_password": "Q pw"}
    argv = [*config_flags(tmp_path, secrets, load_bundled()), "--model-path", "dummy"]
    assert not any(v in " ".join(argv) for v in secrets.values()), argv
    done = subprocess.run(
        [SGLANG_PYTHON, "-c", SCRIPT, json.dumps(argv)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    line = got.pop("line")
    assert got == secrets  # SGLang read each from the file, exactly
    for value in secrets.values():
        assert repr(value) in line  # SGLang prints them as they are (0.5.23)
    shown = redact_text(line)
    for name, value in secrets.items():
        assert repr(value) not in shown and f"'{name}': '{REDACTED}'" in shown, shown
    assert "'model_path': 'dummy'" in shown
