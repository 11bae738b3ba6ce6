"""The ``sglang-supervisor`` command: ``serve`` runs the daemon; the rest talk to one.

Client commands share ``--url`` (default ``$SGLANG_SUPERVISOR_URL`` or
http://127.0.0.1:8470), ``--token`` / ``--token-file`` (default
``$SGLANG_SUPERVISOR_TOKEN``, sent as ``Authorization: Bearer``) and ``--json`` (the
daemon's JSON on stdout, nothing else). Exit codes: 0 done; 1 the daemon unreachable or
another error; 2 refused (invalid levers, bad usage); 3 the change rolled back; 4 the
operation failed; 5 another operation is running; 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from api.cleanup import add_cleanup_parser, run_cleanup

if TYPE_CHECKING:
    from api.client import Client, Json
    from api.follow import OperationFollower
from supervisor.config import Settings

log = logging.getLogger("supervisor")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_INVALID = 2
EXIT_ROLLED_BACK = 3
EXIT_FAILED = 4
EXIT_BUSY = 5
EXIT_INTERRUPTED = 130
OUTCOME_EXIT = {"succeeded": EXIT_OK, "rolled_back": EXIT_ROLLED_BACK, "failed": EXIT_FAILED}


class UsageError(Exception):
    """A bad command line or levers file (exit 2); the message is one line."""


def _serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the daemon (owns the SGLang server)")
    p.add_argument("--simulate", action="store_true", help="simulated SGLang server and GPUs")
    p.add_argument("--config", type=Path, help="TOML config file (deploy/config.example.toml)")
    p.add_argument("--host", help="control API address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="control API port (default 8470)")
    p.add_argument("--state-dir", type=Path, help="where levers, history and logs are kept")
    p.add_argument("--server-port", type=int, help="the SGLang server's port (default 30000)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


# ------------------------------------------------------------------ client options


def add_client_options(p: argparse.ArgumentParser) -> None:
    """``--url``, ``--token``, ``--token-file``, ``--json``: every command that talks to a
    daemon takes them (``api.cli_plan`` may use this too)."""
    g = p.add_argument_group("daemon")
    g.add_argument(
        "--url",
        help="the daemon's control API (default $SGLANG_SUPERVISOR_URL or http://127.0.0.1:8470)",
    )
    g.add_argument("--token", help="bearer token (default $SGLANG_SUPERVISOR_TOKEN)")
    g.add_argument("--token-file", type=Path, help="read the bearer token from this file")
    g.add_argument(
        "--json", action="store_true", help="print the daemon's JSON (nothing else on stdout)"
    )


def client_from_args(args: argparse.Namespace) -> Client:
    """A ``Client`` for ``--url``/``--token``/``--token-file``. Raises ``ClientError``."""
    from api.client import Client, resolve_token, resolve_url

    token = resolve_token(args.token, args.token_file)
    return Client(resolve_url(args.url), token=token)


def _client_parser(
    sub: Any,
    name: str,
    func: Callable[[argparse.Namespace, Client], int],
    help_text: str,
    description: str | None = None,
) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name, help=help_text, description=description or (func.__doc__ or help_text).strip()
    )
    p.set_defaults(func=func)
    add_client_options(p)
    return p


def _follow_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-wait", action="store_true", help="print the operation id and return at once"
    )
    p.add_argument(
        "--poll",
        action="store_true",
        help="follow by polling the operation instead of the event stream "
        "(for proxies that buffer server-sent events)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-supervisor",
        description="Own an SGLang server; change its launch flags safely.",
        epilog="exit codes: 0 done, 1 daemon unreachable or other error, 2 refused "
        "(invalid levers), 3 rolled back, 4 failed, 5 busy (another operation runs)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _client_parser(sub, "status", cmd_status, "the server's state, levers, GPUs and load")
    _client_parser(sub, "levers", cmd_levers, "current levers beside the last-good ones")

    p = _client_parser(sub, "apply", cmd_apply, "change levers: validate, restart, roll back")
    p.add_argument(
        "--set",
        dest="set_",
        action="append",
        default=[],
        metavar="LEVER=VALUE",
        help="a lever (SGLang flag dest name); VALUE reads like TOML: true, 0.9, 8, "
        '"quoted string", [1, 2]; anything else is a string',
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable of the server (NCCL_*, SGLANG_*, CUDA_*, ...)",
    )
    p.add_argument(
        "--unset",
        action="append",
        default=[],
        metavar="LEVER",
        help="remove a lever (back to SGLang's default); env.NAME removes an env var",
    )
    p.add_argument(
        "--file", type=Path, help="a TOML file with [levers] and [env] tables (--set wins)"
    )
    p.add_argument(
        "--replace", action="store_true", help="the given set replaces the current one entirely"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="validate and preflight only; touch nothing"
    )
    p.add_argument(
        "--drain",
        type=float,
        default=0.0,
        metavar="S",
        help="first wait up to S seconds for running and queued requests to finish",
    )
    _follow_options(p)

    for name, text in (
        ("stop", "stop the server: SIGTERM, SIGKILL after the grace, verify GPUs released"),
        ("start", "start the server with the current levers"),
        ("restart", "stop, verify GPUs released, start with the same levers"),
    ):
        described = f"{text[0].upper()}{text[1:]}; each phase is shown as it happens. " + (
            "Exit 0 succeeded, 4 failed, 5 busy (another operation runs)."
        )
        _follow_options(_client_parser(sub, name, cmd_control, text, described))

    p = _client_parser(sub, "logs", cmd_logs, "the server's log (one file per launch)")
    p.add_argument("-n", "--lines", type=int, default=100, metavar="N", help="last N lines")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    p.add_argument(
        "--launch", type=int, default=0, metavar="K", help="0 = current launch, 1 = previous..."
    )

    p = _client_parser(sub, "schema", cmd_schema, "the installed SGLang's flags")
    p.add_argument("word", nargs="?", help="only flags whose name or help mention WORD")

    p = _client_parser(sub, "events", cmd_events, "print the daemon's event stream")
    p.add_argument("--replay", action="store_true", help="start with the recent history")

    _plan_parser(sub)
    add_cleanup_parser(sub)
    return parser


def _plan_parser(sub: Any) -> None:
    # Imported here: api.cli_plan imports this module's client options.
    from api.cli_plan import add_plan_parser

    add_plan_parser(sub)


# ------------------------------------------------------------------ lever values


def parse_value(raw: str) -> Any:
    """A ``--set`` value read like a TOML scalar: ``true``/``false``, ints, floats,
    ``"quoted"`` strings, arrays of those; anything else is the string as given."""
    text = raw.strip()
    if not text or "\n" in text or "\r" in text:
        return raw
    try:
        parsed = tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        return raw
    if set(parsed) != {"v"}:
        return raw
    v = parsed["v"]
    if _plain(v) or (isinstance(v, list) and all(_plain(x) for x in v)):
        return v
    return raw


def _plain(v: Any) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    return isinstance(v, (bool, int, str))


def lever_name(name: str) -> str:
    """``--mem-fraction-static`` / ``mem-fraction-static`` -> ``mem_fraction_static``."""
    return name.strip().lstrip("-").replace("-", "_")


def _assignment(item: str, option: str) -> tuple[str, str]:
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"{option} {item!r}: expected NAME=VALUE")
    return key.strip(), raw


def read_levers_file(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``([levers], [env])`` of a TOML file. Raises ``UsageError``."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}") from exc
    unknown = sorted(set(data) - {"levers", "env"})
    if unknown:
        raise UsageError(
            f"{path}: unexpected {', '.join(unknown)} (the file holds [levers] and [env] tables)"
        )
    levers, env = data.get("levers", {}), data.get("env", {})
    if not isinstance(levers, dict) or not isinstance(env, dict):
        raise UsageError(f"{path}: levers and env must be tables ([levers], [env])")
    return {lever_name(k): v for k, v in levers.items()}, dict(env)


def lever_changes_from_args(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``levers`` and ``env`` of ``apply``: the file, then ``--set``/``--env``/``--unset``
    (a ``None`` value removes). Raises ``UsageError``."""
    levers: dict[str, Any] = {}
    env: dict[str, Any] = {}
    if args.file is not None:
        levers, env = read_levers_file(args.file)
    for item in args.set_:
        key, raw = _assignment(item, "--set")
        levers[lever_name(key)] = parse_value(raw)
    for item in args.env:
        key, raw = _assignment(item, "--env")
        env[key] = raw
    for name in args.unset:
        if name.startswith("env."):
            env[name[4:]] = None
        else:
            levers[lever_name(name)] = None
    return levers, env


# ------------------------------------------------------------------ output


def out(line: str = "") -> None:
    print(line, flush=True)


def err(line: str) -> None:
    print(f"sglang-supervisor: {line}", file=sys.stderr, flush=True)


def print_json(data: Any) -> None:
    out(json.dumps(data, indent=2))


# ------------------------------------------------------------------ commands


def cmd_status(args: argparse.Namespace, client: Client) -> int:
    """Show the daemon's state (since when, and why), the server, the levers (marking
    those that differ from the last-good set), per-GPU memory with member and foreign
    process counts, the running operation, restarts and throughput."""
    from api.render import render_status

    data = client.status()
    if args.json:
        print_json(data)
    else:
        out(render_status(data))
    return EXIT_OK


def cmd_levers(args: argparse.Namespace, client: Client) -> int:
    """Show the current levers and env beside the last-good ones (differences marked)."""
    from api.render import render_levers

    data = client.levers()
    if args.json:
        print_json(data)
    else:
        out(render_levers(data))
    return EXIT_OK


def cmd_apply(args: argparse.Namespace, client: Client) -> int:
    """Apply a lever change: the daemon validates it with SGLang's parser, checks the
    resources, stops the server, verifies the GPUs released, starts it with the new
    levers and commits them, or rolls back to the last-good ones. Each phase is shown
    as it happens. Exit 0 succeeded, 2 refused (nothing touched), 3 rolled back,
    4 failed, 5 busy."""
    from api import render
    from api.follow import OperationFollower

    levers, env = lever_changes_from_args(args)
    if not levers and not env and not args.replace:
        raise UsageError("nothing to apply: give --set, --env, --unset or --file")
    if not math.isfinite(args.drain) or args.drain < 0:
        raise UsageError("--drain must be a number of seconds >= 0")
    before = client.levers()
    quiet = args.json
    with OperationFollower(client, None if quiet else out, use_events=not args.poll) as follower:
        if not (args.no_wait or args.dry_run):
            follower.prepare()
        op = client.apply(
            levers,
            env,
            replace=args.replace,
            dry_run=args.dry_run,
            drain_timeout_s=args.drain,
        )
        changes = render.lever_changes(before, op.get("levers_requested") or {})
        if args.dry_run:
            if quiet:
                print_json(op)
                return OUTCOME_EXIT.get(str(op.get("state")), EXIT_ERROR)
            out("dry run: the levers were checked; nothing was touched")
            for phase in op.get("phases") or []:
                out(render.phase_line(phase, 0.0))
            out("would change: " + (", ".join(changes) if changes else "nothing"))
            return OUTCOME_EXIT.get(str(op.get("state")), EXIT_ERROR)
        return _follow_operation(args, client, follower, op, changes)


def cmd_control(args: argparse.Namespace, client: Client) -> int:
    """Stop, start or restart the server, showing each phase as it happens (stop:
    SIGTERM, SIGKILL after the grace period, GPUs verified released). Exit 0 succeeded,
    4 failed, 5 busy."""
    from api.follow import OperationFollower

    emit = None if args.json else out
    with OperationFollower(client, emit, use_events=not args.poll) as follower:
        if not args.no_wait:
            follower.prepare()
        op = client.control(args.command)
        return _follow_operation(args, client, follower, op, None)


def _follow_operation(
    args: argparse.Namespace,
    client: Client,
    follower: OperationFollower,
    op: Json,
    changes: list[str] | None,
) -> int:
    from api import render

    op_id = op.get("id")
    if not args.json:
        head = f"{op.get('kind')} {op_id}"
        if changes is not None:
            head += ": " + (", ".join(changes) if changes else "no lever changes (same levers)")
        out(head)
    if args.no_wait:
        if args.json:
            print_json(op)
        else:
            out(f"submitted; follow it with `sglang-supervisor status` (GET /operations/{op_id})")
        return EXIT_OK
    try:
        final = follower.follow(op)
    except KeyboardInterrupt:
        err(
            f"interrupted: operation {op_id} goes on in the daemon "
            "(`sglang-supervisor status` shows it)"
        )
        return EXIT_INTERRUPTED
    if args.json:
        print_json(final)
        return OUTCOME_EXIT.get(str(final.get("state")), EXIT_ERROR)
    return _report_outcome(client, final, render.terminal_width(), follower.logs.shown)


def _report_outcome(client: Client, op: Json, width: int, live_log_lines: int = 0) -> int:
    """Print how the operation ended; return its exit code. The failed launch's log tail
    is printed whole, or only its end when its lines were already shown live."""
    from api import render
    from api.client import ClientError

    state = str(op.get("state"))
    took = render.duration(op.get("duration_s"))
    if state == "succeeded":
        line = f"succeeded in {took}"
        if op.get("kind") in ("apply", "start", "restart"):
            with contextlib.suppress(ClientError):
                srv = client.status().get("server")
                if srv:
                    tokens = srv.get("max_total_num_tokens")
                    line += f": pid {srv.get('pid')} serving"
                    if tokens is not None:
                        line += f", max_total_num_tokens {tokens:,}"
        out(line)
        return EXIT_OK
    tail = [str(x) for x in op.get("log_tail") or []]
    if state == "rolled_back":
        out(f"rolled back after {took}: {op.get('rollback_reason') or op.get('error')}")
        out("the last-good levers serve again")
    else:
        out(f"FAILED after {took}: {op.get('error')}")
    if tail:
        if live_log_lines and len(tail) > 10:
            tail = tail[-10:]
            out("the failed launch's last log lines (more above):")
        else:
            out("the failed launch's last log lines:")
        for line in tail:
            out(render.log_line(line, width))
    if state != "rolled_back":
        out("see `sglang-supervisor status` for what runs now")
    return OUTCOME_EXIT.get(state, EXIT_ERROR)


def cmd_logs(args: argparse.Namespace, client: Client) -> int:
    """Print the server's last N log lines (of launch K: 0 = current, 1 = previous...);
    with -f keep printing new lines until Ctrl-C."""
    from api.client import NotFound

    if args.lines < 0 or args.launch < 0:
        raise UsageError("-n and --launch must be >= 0")
    if not args.follow:
        text = client.logs(args.lines, args.launch)
        if args.json:
            print_json({"path": text.path, "lines": text.lines})
        else:
            for line in text.lines:
                out(line)
        return EXIT_OK
    window = max(args.lines, 500)
    try:
        first = client.logs(window, args.launch)
    except NotFound as exc:
        if exc.endpoint_missing:
            raise
        first = None
    try:
        return _follow_logs(args, client, first, window)
    except KeyboardInterrupt:
        return EXIT_OK


def _follow_logs(args: argparse.Namespace, client: Client, first: Any, window: int) -> int:
    from api.client import NotFound
    from api.follow import new_lines

    def show(line: str) -> None:
        out(json.dumps(line) if args.json else line)

    path: str | None = None
    seen: list[str] = []
    if first is not None:
        path, seen = first.path, list(first.lines)
        for line in seen[-args.lines :] if args.lines else []:
            show(line)
    interval, fastest, slowest = 0.25, 0.25, 2.0
    while True:
        time.sleep(interval)
        try:
            text = client.logs(window, args.launch)
        except NotFound as exc:
            if exc.endpoint_missing:
                raise
            continue
        if text.path != path:
            if path is not None and not args.json:
                out(f"--- a new launch: {text.path or 'log'} ---")
            path, seen = text.path, []
        fresh = new_lines(seen, text.lines)
        seen = list(text.lines)
        for line in fresh:
            show(line)
        interval = fastest if fresh else min(slowest, interval * 1.5)


def cmd_schema(args: argparse.Namespace, client: Client) -> int:
    """List the installed SGLang's flags (those mentioning WORD): dest, option, type,
    default, choices and help. Exit 1 when no flag matches."""
    from api.render import render_schema

    data = client.schema(args.word)
    if args.json:
        print_json(data)
    elif not data.get("flags"):
        err(f"no SGLang flag mentions {args.word!r}")
    else:
        out(render_schema(data, args.word))
    return EXIT_OK if data.get("flags") else EXIT_ERROR


def cmd_events(args: argparse.Namespace, client: Client) -> int:
    """Print the daemon's events as they happen (state transitions, operation phases,
    per-GPU memory during release, launches) until Ctrl-C. A stream that breaks is
    reopened (events in between come back from the daemon's recent history)."""
    from api.client import ClientError
    from api.follow import SeqFilter
    from api.render import render_event, terminal_width

    width = terminal_width() if sys.stdout.isatty() else None
    seen = SeqFilter()
    replay = bool(args.replay)
    try:
        while True:
            # The daemon sends a keep-alive every 15 s: silence for 45 s is a dead stream.
            with client.events(replay=replay, read_timeout_s=45) as stream:
                try:
                    for event in stream:
                        if seen.fresh(event):
                            out(json.dumps(event) if args.json else render_event(event, width))
                except ClientError:
                    pass
            # Ended or broke: reopen, with the history so nothing in between is lost.
            replay = replay or seen.seq > 0
            time.sleep(0.2)
    except KeyboardInterrupt:
        return EXIT_OK


def run_client_command(args: argparse.Namespace) -> int:
    """Run a client command; every failure becomes a one-line message and an exit code."""
    from api.client import Busy, ClientError, Invalid, Unreachable

    func: Callable[[argparse.Namespace, Client], int] = args.func
    try:
        with client_from_args(args) as client:
            try:
                return func(args, client)
            except Busy as exc:
                return _busy(args, client, exc)
    except UsageError as exc:
        err(str(exc))
        return EXIT_INVALID
    except Invalid as exc:
        if args.json:
            print_json(exc.body)
        err(str(exc) if exc.problems else f"refused: {exc}")
        for lever, message in exc.problems:
            print(f"  {lever}: {message}", file=sys.stderr, flush=True)
        return EXIT_INVALID
    except Unreachable as exc:
        err(str(exc))
        return EXIT_ERROR
    except ClientError as exc:
        err(str(exc))
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED


def _busy(args: argparse.Namespace, client: Client, exc: Any) -> int:
    from api.client import ClientError
    from api.render import running_operation

    if args.json:
        print_json(exc.body)
    what = str(exc)
    if exc.operation_id:
        with contextlib.suppress(ClientError):
            what = "busy: " + running_operation(client.operation(exc.operation_id))
            what += " (wait for it, or watch it with `sglang-supervisor events`)"
    err(what)
    return EXIT_BUSY


# ------------------------------------------------------------------ serve


def settings_from_args(args: argparse.Namespace) -> Settings:
    from supervisor.config import load_settings

    overrides: dict[str, Any] = {
        "api.host": args.host,
        "api.port": args.port,
        "state_dir": str(args.state_dir) if args.state_dir else None,
        "server.port": args.server_port,
    }
    if args.simulate:
        overrides["simulate"] = True
    return load_settings(args.config, overrides)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        logging.basicConfig(
            level=getattr(logging, args.log_level.upper()),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        try:
            settings = settings_from_args(args)
        except ValueError as exc:
            print(f"sglang-supervisor: {exc}", file=sys.stderr)
            return 2
        from api.daemon import serve  # the server side, only when serving

        return asyncio.run(serve(settings, args.log_level))
    if args.command == "plan":
        from api.cli_plan import run_plan

        code: int = run_plan(args)
        return code
    if args.command == "cleanup":
        return run_cleanup(args)
    if getattr(args, "func", None) is None:
        parser.error(f"unknown command {args.command}")
    try:
        return run_client_command(args)
    except BrokenPipeError:
        # stdout closed early (`| head`): stop quietly, and keep Python from complaining
        # about the flush at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
