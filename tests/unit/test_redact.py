"""Secrets passed as levers never show: names SGLang 0.5.23 defines as secrets
(server_args.py: --api-key, --admin-api-key, --ssl-keyfile-password) and secret-named
environment variables."""

from __future__ import annotations

import json
import time

from sglang_supervisor.redact import (
    MAX_KNOWN,
    REDACTED,
    is_secret_env,
    redact,
    redact_text,
    remember,
)


def test_secret_levers_env_and_diffs_are_hidden_everything_else_kept() -> None:
    status = {
        "levers": {"api_key": "sk-123", "admin_api_key": "adm", "tp_size": 8},
        "env": {"SGLANG_API_KEY": "k", "HF_TOKEN": "hf_x", "NCCL_DEBUG": "WARN"},
        "last_good_levers": {"levers": {"api_key": "old"}, "env": {}},
        "throughput": {"token_usage": 0.97},
        "server": {"max_total_num_tokens": 1000},
        "diff": {
            "api_key": {"old": None, "new": "sk-9"},
            "env.HF_TOKEN": {"old": "a", "new": None},
        },
        "phases": [{"name": "validate", "levers": {"ssl_keyfile_password": "pw"}}],
    }
    out = redact(status)
    assert out["levers"] == {"api_key": REDACTED, "admin_api_key": REDACTED, "tp_size": 8}
    assert out["env"] == {"SGLANG_API_KEY": REDACTED, "HF_TOKEN": REDACTED, "NCCL_DEBUG": "WARN"}
    assert out["last_good_levers"]["levers"]["api_key"] == REDACTED
    assert out["throughput"] == {"token_usage": 0.97}
    assert out["server"] == {"max_total_num_tokens": 1000}
    assert out["diff"]["api_key"] == {"old": None, "new": REDACTED}
    assert out["diff"]["env.HF_TOKEN"] == {"old": REDACTED, "new": None}
    assert out["phases"][0]["levers"]["ssl_keyfile_password"] == REDACTED
    assert "sk-123" not in repr(out) and "hf_x" not in repr(out)
    assert status["levers"]["api_key"] == "sk-123"  # the input is not changed


def test_env_names() -> None:
    assert is_secret_env("SGLANG_ADMIN_KEY") and is_secret_env("NCCL_IB_SECRET")
    assert not is_secret_env("SGLANG_MAX_TOKENS") and not is_secret_env("CUDA_KEYRING")
    assert not is_secret_env("token_usage")


def test_credentials_inside_url_values_are_hidden_whatever_the_name() -> None:
    """Issue 20 §4: HF_ENDPOINT=https://user:secret@host/... showed its password."""
    status = {
        "env": {
            "HF_ENDPOINT": "https://alice:s3cr3t@hub.example.com/models",
            "SGLANG_MIRROR": "http://mirror.local:8080/x?token=tk-42&rev=main",
            "NO_PROXY": "localhost",
        },
        "error": "cannot reach https://bob:p%40ss:w@proxy:3128/ (signed https://b/o?X-Amz-Signature=abc)",
        "argv": ["--model-path", "s3://k:hidden@bucket/m"],
    }
    out = redact(status)
    text = repr(out)
    for secret in ("s3cr3t", "tk-42", "p%40ss", "abc", "hidden"):
        assert secret not in text, secret
    assert out["env"]["HF_ENDPOINT"] == f"https://alice:{REDACTED}@hub.example.com/models"
    assert out["env"]["SGLANG_MIRROR"] == f"http://mirror.local:8080/x?token={REDACTED}&rev=main"
    assert out["env"]["NO_PROXY"] == "localhost"
    assert out["argv"][1] == f"s3://k:{REDACTED}@bucket/m"
    # A URL without a password, a port and ordinary query parameters are kept as they are.
    plain = "http://host:30000/v1/models?revision=main&max_tokens=8 user@example.com"
    assert redact({"x": plain}) == {"x": plain}


def test_redact_text_is_linear_in_a_long_run_of_letters() -> None:
    """The URL pattern's unbounded scheme rescanned a run of letters from every position:
    100,000 of them before an ``=`` took about 18 s (with the GIL held)."""
    # A guard against the quadratic scan, not a timing goal: ~0.05 s now.
    began = time.monotonic()
    assert redact_text("a" * 100_000 + "=") == "a" * 100_000 + "="
    assert time.monotonic() - began < 6.0
    # Still found after a long run: the scheme is the run's last 64 characters at most.
    assert redact_text("x" * 300 + "https://u:pw@h/") == "x" * 300 + "https://u:<redacted>@h/"


#: Values of every length, with the quotes and backslashes Python's repr escapes; each
#: starts with "Q", which is nowhere else in the lines.
VALUES = ["Q", "Q1234", "Qsk-" + "x" * 40, "Qa\"b'c", "Qback\\slash", "Qsp ace", "Qü-ключ"]


def test_sglang_prints_of_a_secret_flag_hide_its_value_whatever_its_length() -> None:
    """SGLang 0.5.23 logs ``server_args=`` and a dict of every flag at start
    (``srt/entrypoints/engine.py:311``, its ``_server_args_for_logging`` at :173 hides only
    the watermark's keys); ``ServerArgs.__repr__`` (``srt/server_args.py:307``) prints
    ``api_key='...'``. A key under six characters passed the journal's scrubber in the
    first form, and every other path out had no scrubber at all (issue 27 §1)."""
    for value in VALUES:
        fields = {"model_path": "m", "api_key": value, "admin_api_key": value, "port": 1}
        fields |= {"ssl_keyfile_password": None, "tp_size": 8}
        kwargs = ", ".join(f"{k}={v!r}" for k, v in fields.items())
        lines = {
            "0.5.23": f"[2026-12-01 10:00:00] server_args={fields!r}",
            "repr": f"server_args=ServerArgs({kwargs})",
            "json": json.dumps({"levers": fields}),
            "argv": f"launching: python -m sglang.launch_server --api-key {value!r} --port 1",
            "argv=": f"--admin-api-key={value} --tp 8",
            "argv list": repr(["--api-key", value, "--tp-size", "8"]),
            "env": "HF_TOKEN=" + value.replace(" ", "") + " NCCL_DEBUG=INFO",
        }
        for form, line in lines.items():
            out = redact_text(line)
            assert "Q" not in out and REDACTED in out, (form, out)
        assert "'model_path': 'm'" in redact_text(lines["0.5.23"])
        assert "'ssl_keyfile_password': None, 'tp_size': 8" in redact_text(lines["0.5.23"])
        assert "NCCL_DEBUG=INFO" in redact_text(lines["env"])
    # Not set is not a secret, and a name that is not secret keeps its value.
    plain = "server_args={'api_key': None, 'tokenizer_path': 'k1234', 'max_tokens': 5}"
    assert redact_text(plain) == plain


def test_the_values_of_every_launch_are_hidden_wherever_they_appear() -> None:
    """A traceback or a message may quote a secret in no known form: the values of the
    launches' secret levers and env (remembered, bounded) are hidden in any text, and so
    are the daemon's own environment's; a short one is not (it would hide "1")."""
    remember({"api_key": "sk-remembered-1", "tp_size": 8}, {"HF_TOKEN": "hf_remembered"})
    text = "401: key sk-remembered-1 refused; token hf_remembered; tp 8; k1"
    assert redact_text(text) == "401: key <redacted> refused; token <redacted>; tp 8; k1"
    for n in range(MAX_KNOWN + 1):
        remember({"api_key": f"sk-later-{n:04d}"}, {})
    assert "sk-remembered-1" in redact_text("sk-remembered-1")  # the oldest made way
    assert redact_text("sk-later-0064") == REDACTED
