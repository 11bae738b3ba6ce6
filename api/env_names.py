"""The environment variables the daemon and the command line both read, spelled once:
the daemon's tokens. Here rather than in ``auth`` so that the CLI, which sends the token,
imports no server stack (FastAPI, Starlette) to learn its name."""

from __future__ import annotations

TOKEN_ENV = "SGLANG_SUPERVISOR_TOKEN"
READ_TOKEN_ENV = "SGLANG_SUPERVISOR_READ_TOKEN"
