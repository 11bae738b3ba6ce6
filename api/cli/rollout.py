"""``sglang-supervisor rollout``: one lever change across replicas, one at a time.

Every replica's daemon first validates the change (a dry run: SGLang's parser, the
resource checks); if one refuses, nothing is touched anywhere. Then each replica applies
it in turn. With ``[router]`` configured, a daemon takes its server out of the router,
drains it, restarts it, and commits only once the router lists the new server healthy, so
the next replica starts only when this one serves again through the router. The rollout
stops at the first replica that rolls back or fails; the rest are left as they are.

Replicas come from ``--daemon URL`` (repeatable, in order) or ``--fleet FILE``, a TOML
file: ``daemons = ["http://gpu-a:8470", "http://gpu-b:8470"]`` and optionally
``token_file = "/etc/sglang-supervisor/token"`` (the token every daemon accepts).
Exit codes as ``apply``: 0 every replica succeeded, 2 refused by a dry run (nothing
touched), 3 a replica rolled back, 4 one failed, 5 one was busy, 6 one refused the token,
1 one was unreachable.
"""

from __future__ import annotations

import argparse
import math
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_supervisor_api.cli.client import Client, Json, resolve_token
from sglang_supervisor_api.cli.client_errors import Busy, ClientError, Invalid
from sglang_supervisor_api.cli.exits import (
    EXIT_BUSY,
    EXIT_ERROR,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_UNAUTHORIZED,
    UsageError,
    error_exit,
    outcome_exit,
)
from sglang_supervisor_api.cli.follow import OperationFollower
from sglang_supervisor_api.cli.levers_input import lever_changes_from_args
from sglang_supervisor_api.cli.output import err, out, print_json
from sglang_supervisor_api.cli.text import duration
from sglang_supervisor_api.cli.tls import resolve_cacert


@dataclass
class Replica:
    url: str
    outcome: str = "not started"
    took_s: float | None = None
    detail: str = ""
    exit_code: int = EXIT_OK


def add_rollout_parser(sub: Any) -> None:
    doc = __doc__ or ""
    p = sub.add_parser(
        "rollout",
        help="apply a lever change to several replicas, one at a time",
        description=doc.split("\n\n", 1)[1].strip(),
    )
    p.add_argument(
        "--daemon",
        action="append",
        default=[],
        metavar="URL",
        help="a replica's daemon (its control API); repeat, in rollout order",
    )
    p.add_argument("--fleet", type=Path, help="a TOML file listing the daemons (see above)")
    p.add_argument("--token", help="bearer token (default $SGLANG_SUPERVISOR_TOKEN)")
    p.add_argument("--token-file", type=Path, help="read the bearer token from this file")
    p.add_argument(
        "--cacert",
        type=Path,
        metavar="PATH",
        help="trust this PEM certificate for https daemons (default $SGLANG_SUPERVISOR_CACERT)",
    )
    p.add_argument("--json", action="store_true", help="print the replicas' outcomes as JSON")
    p.add_argument(
        "--poll", action="store_true", help="follow by polling instead of the event stream"
    )
    p.add_argument("--set", dest="set_", action="append", default=[], metavar="LEVER=VALUE")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--unset", action="append", default=[], metavar="LEVER")
    p.add_argument("--file", type=Path, help="a TOML file with [levers] and [env] tables")
    p.add_argument(
        "--drain",
        type=float,
        default=0.0,
        metavar="S",
        help="daemons without a router: first wait up to S seconds for requests to finish",
    )
    p.set_defaults(func=run_rollout)


def _fleet(args: argparse.Namespace) -> tuple[list[str], str | None]:
    urls = list(args.daemon)
    token_file: Path | None = args.token_file
    if args.fleet is not None:
        try:
            data = tomllib.loads(args.fleet.read_text())
        except OSError as exc:
            raise UsageError(f"cannot read {args.fleet}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{args.fleet} is not valid TOML: {exc}") from exc
        daemons = data.get("daemons")
        if not isinstance(daemons, list) or not all(isinstance(d, str) for d in daemons):
            raise UsageError(f'{args.fleet}: expected daemons = ["http://host:8470", ...]')
        urls += daemons
        if token_file is None and isinstance(data.get("token_file"), str):
            token_file = Path(data["token_file"])
    if not urls:
        raise UsageError("no replicas: give --daemon URL (repeatable) or --fleet FILE")
    if len(set(urls)) != len(urls):
        raise UsageError("a daemon is listed twice")
    return urls, resolve_token(args.token, token_file)


def run_rollout(args: argparse.Namespace) -> int:
    try:
        urls, token = _fleet(args)
        levers, env = lever_changes_from_args(args)
        if not levers and not env:
            raise UsageError("nothing to roll out: give --set, --env, --unset or --file")
        if not math.isfinite(args.drain) or args.drain < 0:
            raise UsageError("--drain must be a number of seconds >= 0")
    except (UsageError, ClientError) as exc:
        err(str(exc))
        return EXIT_INVALID if isinstance(exc, UsageError) else EXIT_ERROR
    replicas = [Replica(u) for u in urls]
    cacert = resolve_cacert(args.cacert)
    try:
        # An unreachable replica's message says how to give another address: rollout's
        # own options (it has no --url).
        hint = "correct this replica's --daemon URL or its entry in the --fleet file"
        clients = [
            Client(
                u,
                token=token,
                cacert=cacert,
                url_from="--daemon" if u in args.daemon else f"--fleet {args.fleet}",
                url_hint=hint,
            )
            for u in urls
        ]
    except ClientError as exc:
        err(str(exc))
        return EXIT_ERROR
    try:
        code = _validate_all(args, clients, replicas, levers, env)
        if code == EXIT_OK:
            for client, replica in zip(clients, replicas, strict=True):
                code = _apply_one(args, client, replica, levers, env)
                if code != EXIT_OK:
                    for rest in replicas:
                        if rest.outcome == "validated":
                            rest.outcome = "not started"
                            rest.detail = f"the rollout stopped at {replica.url}"
                    break
    except KeyboardInterrupt:
        err("interrupted: an apply already submitted goes on in its daemon")
        code = 130
    finally:
        for c in clients:
            c.close()
    _report(args, replicas)
    return code


def _failure(replica: Replica, exc: ClientError) -> int:
    if isinstance(exc, Invalid):
        replica.outcome, replica.exit_code = "refused", EXIT_INVALID
        problems = "; ".join(f"{lever}: {msg}" for lever, msg in exc.problems)
        replica.detail = problems or str(exc)
    elif isinstance(exc, Busy):
        replica.outcome, replica.exit_code = "busy", EXIT_BUSY
        replica.detail = str(exc)
    else:
        replica.exit_code = error_exit(exc)
        replica.outcome = (
            "unauthorized" if replica.exit_code == EXIT_UNAUTHORIZED else "unreachable"
        )
        replica.detail = str(exc)
    return replica.exit_code


def _validate_all(
    args: argparse.Namespace,
    clients: list[Client],
    replicas: list[Replica],
    levers: dict[str, Any],
    env: dict[str, Any],
) -> int:
    """Dry-run on every replica; the first refusal's exit code (after asking all)."""
    worst = EXIT_OK
    for client, replica in zip(clients, replicas, strict=True):
        try:
            op = client.apply(levers, env, dry_run=True)
        except ClientError as exc:
            code = _failure(replica, exc)
        else:
            code = outcome_exit(op.get("state"))
            replica.outcome = "validated" if code == EXIT_OK else f"dry run {op.get('state')}"
            replica.detail = "" if code == EXIT_OK else str(op.get("error") or "")
            replica.exit_code = code
        if not args.json:
            out(f"[{replica.url}] dry run: {replica.outcome} {replica.detail}".rstrip())
        if code != EXIT_OK and worst == EXIT_OK:
            worst = code
    if worst != EXIT_OK:
        for r in replicas:
            if r.outcome == "validated":
                r.outcome, r.detail = "not started", "another replica refused the change"
    return worst


def _apply_one(
    args: argparse.Namespace,
    client: Client,
    replica: Replica,
    levers: dict[str, Any],
    env: dict[str, Any],
) -> int:
    """Apply on one replica and follow it to its end; then confirm it serves through the
    router (when the daemon has one)."""
    emit = None if args.json else (lambda line: out(f"[{replica.url}] {line}"))
    started = time.monotonic()
    try:
        with OperationFollower(client, emit, use_events=not args.poll) as follower:
            follower.prepare()
            op = client.apply(levers, env, drain_timeout_s=args.drain)
            final = follower.follow(op)
        replica.took_s = time.monotonic() - started
        state = str(final.get("state"))
        replica.outcome, replica.exit_code = state, outcome_exit(state)
        if state != "succeeded":
            replica.detail = str(final.get("rollback_reason") or final.get("error") or "")
            return replica.exit_code
        replica.detail = _router_detail(client.status())
    except ClientError as exc:
        replica.took_s = time.monotonic() - started
        return _failure(replica, exc)
    if replica.detail.startswith("NOT"):
        replica.outcome, replica.exit_code = "failed", outcome_exit("failed")
    return replica.exit_code


def _router_detail(status: Json) -> str:
    router = status.get("router")
    if not isinstance(router, dict) or not router.get("url"):
        return "no router configured: its clients saw the restart"
    if router.get("registered") is True:
        return f"back in the router {router['url']} as {router.get('worker_url')}"
    return f"NOT in the router {router['url']}: {router.get('error') or 'not listed'}"


def _report(args: argparse.Namespace, replicas: list[Replica]) -> None:
    if args.json:
        print_json(
            [
                {
                    "daemon": r.url,
                    "outcome": r.outcome,
                    "duration_s": r.took_s,
                    "detail": r.detail,
                }
                for r in replicas
            ]
        )
        return
    width = max(len("replica"), *(len(r.url) for r in replicas))
    out("")
    out(f"{'replica':<{width}}  {'outcome':<12} {'took':>8}  detail")
    for r in replicas:
        took = duration(r.took_s) if r.took_s is not None else "-"
        out(f"{r.url:<{width}}  {r.outcome:<12} {took:>8}  {r.detail}")
