"""SGLang 0.5.23's own code: the argv the daemon launches parses in SGLang's parser, and
SGLang's access-log filter (``_configure_uvicorn_access_log_filter`` ->
``UvicornAccessLogFilter``, ``srt/utils/common.py:3452``/``:3524``) then drops the
daemon's probes and keeps every other request; the lever turns it off."""

from __future__ import annotations

import json
import subprocess

import pytest

from sglang_supervisor.config import ServerSettings
from sglang_supervisor.engine.server import launch_flags
from sglang_supervisor.sglang.accesslog import PROBE_PATHS
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.sglang.schema import load_bundled
from tests.sglang_env import ENV, SGLANG_PYTHON, needs_sglang

pytestmark = needs_sglang()

# Runs in SGLang's interpreter: SGLang's parser, SGLang's filter, uvicorn's logging layout
# (its LOGGING_CONFIG's "access" handler and "uvicorn.access" logger, which the filter
# attaches to; the test environment has no uvicorn), one access record per path.
SCRIPT = """
import argparse, json, logging.config, sys
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.common import _configure_uvicorn_access_log_filter

argv, paths = json.loads(sys.argv[1]), json.loads(sys.argv[2])
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
args = parser.parse_args(argv)
config = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"access": {"format": "%(message)s"}},
    "handlers": {"access": {"class": "logging.StreamHandler", "formatter": "access",
                            "stream": "ext://sys.stdout"}},
    "loggers": {"uvicorn.access": {"handlers": ["access"], "level": "INFO",
                                   "propagate": False}},
}
_configure_uvicorn_access_log_filter(config, args)
logging.config.dictConfig(config)
for path in paths:
    logging.getLogger("uvicorn.access").info(
        '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "GET", path, "1.1", 200
    )
"""
CLIENT_PATHS = ["/v1/models", "/generate", "/v1/chat/completions", "/health"]


def logged(levers: dict[str, object]) -> list[str]:
    argv = launch_flags(LeverSet(levers), load_bundled(), ServerSettings())
    out = subprocess.run(
        [SGLANG_PYTHON, "-c", SCRIPT, json.dumps(argv), json.dumps([*PROBE_PATHS, *CLIENT_PATHS])],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [line.split()[3] for line in out.stdout.splitlines()]


@pytest.mark.timeout(300)
def test_sglang_drops_the_probes_by_default_and_logs_all_when_the_lever_says() -> None:
    assert logged({"model_path": "m"}) == CLIENT_PATHS
    assert logged({"model_path": "m", "uvicorn_access_log_exclude_prefixes": []}) == [
        *PROBE_PATHS,
        *CLIENT_PATHS,
    ]
