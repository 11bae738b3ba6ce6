"""``sglang-supervisor rollout``: one lever change across replicas: canaries first, then
at most M at a time.

Every replica's daemon first validates the change (a dry run: SGLang's parser, the
resource checks); if one refuses, nothing is touched anywhere. With ``--canary N`` the
first N replicas apply it first, with the effect guard: each daemon commits only after
its effect window ([timeouts] effect_window_s) and rolls a worse change back itself; the
rollout goes on only when every canary's measured effect is better or unchanged under
comparable load, else it stops and puts the canaries back on their old levers. Then the
rest apply it, ``--max-unavailable M`` at a time (default 1): with ``[router]``
configured, a daemon takes its server out of the router, drains it, restarts it, and
commits only once the router lists the new server healthy, so never more than M
replicas are out of the router. The rollout stops at the first replica that rolls back
or fails; those not started are left as they are.

Replicas come from ``--daemon URL`` (repeatable, in order) or ``--fleet FILE``, a TOML
file: ``daemons = ["http://gpu-a:8470", "http://gpu-b:8470"]`` and optionally
``token_file = "/etc/sglang-supervisor/token"`` (the token every daemon accepts).
Exit codes as ``apply``: 0 every replica succeeded, 2 refused by a dry run (nothing
touched), 3 a replica rolled back (or the canaries did not prove the change), 4 one
failed, 5 one was busy, 6 one refused the token, 1 one was unreachable.
"""

from __future__ import annotations

import argparse
import math
import tomllib
from pathlib import Path
from typing import Any

from sglang_supervisor_api.cli.client import Client, resolve_token
from sglang_supervisor_api.cli.client_errors import ClientError
from sglang_supervisor_api.cli.exits import (
    EXIT_ERROR,
    EXIT_INVALID,
    EXIT_OK,
    UsageError,
    outcome_exit,
)
from sglang_supervisor_api.cli.levers_input import lever_changes_from_args
from sglang_supervisor_api.cli.output import err, out, print_json
from sglang_supervisor_api.cli.rollout_run import Replica, Rollout, failure
from sglang_supervisor_api.cli.text import duration
from sglang_supervisor_api.cli.tls import resolve_cacert


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
    p.add_argument(
        "--canary",
        type=int,
        default=0,
        metavar="N",
        help="the first N replicas first, each held until its measured effect is better or "
        "unchanged (else the rollout stops and they go back to their old levers)",
    )
    p.add_argument(
        "--max-unavailable",
        type=int,
        default=1,
        metavar="M",
        help="apply M replicas at a time (never more than M out of the router); default 1",
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
        if not 0 <= args.canary <= len(urls):
            raise UsageError(f"--canary must be between 0 and the {len(urls)} replicas")
        if args.max_unavailable < 1:
            raise UsageError("--max-unavailable must be at least 1")
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
            code = Rollout(args, clients, replicas, levers, env).run()
    except KeyboardInterrupt:
        err("interrupted: an apply already submitted goes on in its daemon")
        code = 130
    finally:
        for c in clients:
            c.close()
    _report(args, replicas)
    return code


def _validate_all(
    args: argparse.Namespace,
    clients: list[Client],
    replicas: list[Replica],
    levers: dict[str, Any],
    env: dict[str, Any],
) -> int:
    """Dry-run on every replica; the first refusal's exit code (after asking all)."""
    worst = EXIT_OK
    for i, (client, replica) in enumerate(zip(clients, replicas, strict=True)):
        try:
            # A canary is checked with the guard it will apply with (a daemon without an
            # effect window refuses it now, not after the others applied).
            op = client.apply(
                levers, env, dry_run=True, effect_guard=True if i < args.canary else None
            )
        except ClientError as exc:
            code = failure(replica, exc)
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


def _report(args: argparse.Namespace, replicas: list[Replica]) -> None:
    if args.json:
        print_json(
            [
                {
                    "daemon": r.url,
                    "outcome": r.outcome,
                    "duration_s": r.took_s,
                    "detail": r.detail,
                    "canary": r.canary,
                    "effect": r.op.get("effect"),
                }
                for r in replicas
            ]
        )
        return
    width = max(len("replica"), *(len(r.url) + (9 if r.canary else 0) for r in replicas))
    out("")
    out(f"{'replica':<{width}}  {'outcome':<12} {'took':>8}  detail")
    for r in replicas:
        took = duration(r.took_s) if r.took_s is not None else "-"
        name = f"{r.url} (canary)" if r.canary else r.url
        out(f"{name:<{width}}  {r.outcome:<12} {took:>8}  {r.detail}")
