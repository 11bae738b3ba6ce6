"""Secrets passed as levers never show: names SGLang 0.5.23 defines as secrets
(server_args.py: --api-key, --admin-api-key, --ssl-keyfile-password) and secret-named
environment variables."""

from __future__ import annotations

import time

from sglang_supervisor.redact import REDACTED, is_secret_env, redact, redact_text


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
