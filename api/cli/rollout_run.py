"""Running a rollout once every replica validated it: the canaries first, held until their
measured effect is proven no worse, then the rest at most ``--max-unavailable`` at a time.

Canaries apply with the effect guard (``effect_guard``: their daemon commits only after
the effect window, and rolls a worse change back itself). The rollout goes on only when
every canary committed with a verdict of ``better`` or ``unchanged`` — no worse under
comparable load; any other (worse, mixed, load changed, no load, not measured,
interrupted, a failed start) stops it, and the canaries that committed are put back on
their old levers (an apply of each changed lever's value before the canary's apply). The
rest apply in a sliding window of ``M``: a replica leaves the router only inside its own
apply (``router_remove`` to ``router_add``), so never more than ``M`` are out at once; the
first replica that fails stops new applies (those in flight end on their own).
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sglang_supervisor.redact import REDACTED
from sglang_supervisor_api.cli.client import Client, Json
from sglang_supervisor_api.cli.client_errors import Busy, ClientError, Invalid
from sglang_supervisor_api.cli.exits import (
    EXIT_BUSY,
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_ROLLED_BACK,
    EXIT_UNAUTHORIZED,
    error_exit,
    outcome_exit,
)
from sglang_supervisor_api.cli.follow import OperationFollower
from sglang_supervisor_api.cli.output import out
from sglang_supervisor_api.cli.render_effect import effect_summary

#: The canary verdicts that let the rollout go on: measured, and no worse.
PASSING = ("better", "unchanged")


@dataclass
class Replica:
    url: str
    outcome: str = "not started"
    took_s: float | None = None
    detail: str = ""
    exit_code: int = EXIT_OK
    canary: bool = False
    #: The final operation of its apply (its effect, the levers before it).
    op: Json = field(default_factory=dict)

    @property
    def verdict(self) -> str | None:
        effect = self.op.get("effect")
        return str(effect.get("verdict")) if isinstance(effect, dict) else None


def failure(replica: Replica, exc: ClientError) -> int:
    """Record a refused, busy or unreachable replica; its exit code."""
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


class Rollout:
    """One rollout's applies: the canary stage, then the waves."""

    def __init__(
        self,
        args: argparse.Namespace,
        clients: list[Client],
        replicas: list[Replica],
        levers: dict[str, Any],
        env: dict[str, Any],
    ) -> None:
        self.args, self.levers, self.env = args, levers, env
        self.pairs = list(zip(clients, replicas, strict=True))
        self.canaries = self.pairs[: args.canary]
        for _, r in self.canaries:
            r.canary = True
        self._lock = threading.Lock()

    def emit(self, replica: Replica) -> Callable[[str], None] | None:
        if self.args.json:
            return None

        def line(text: str) -> None:
            with self._lock:  # one line at a time from the replicas' threads
                out(f"[{replica.url}] {text}")

        return line

    # ---------------------------------------------------------------- the stages

    def run(self) -> int:
        """The canaries (held, judged), then the rest; the first failure's exit code."""
        rest = self.pairs[len(self.canaries) :]
        if self.canaries:
            code = self.wave(self.canaries, guard=True)
            if code == EXIT_OK:
                code = self.judge_canaries()
            if code != EXIT_OK:
                self.revert_canaries()
                self.not_started(rest, "the canaries did not prove the change no worse")
                if any(r.exit_code == EXIT_FAILED for _, r in self.canaries):
                    return EXIT_FAILED
                return code
        return self.wave(rest, guard=False)

    def wave(self, pairs: list[tuple[Client, Replica]], *, guard: bool) -> int:
        """Apply each replica, at most ``--max-unavailable`` at once, in order; none is
        started after the first that fails. Returns the first failure's exit code."""
        slots = threading.BoundedSemaphore(self.args.max_unavailable)
        failed: list[Replica] = []
        threads: list[threading.Thread] = []

        def one(client: Client, replica: Replica) -> None:
            try:
                if self.apply_one(client, replica, guard=guard) != EXIT_OK:
                    with self._lock:
                        failed.append(replica)
            finally:
                slots.release()

        for client, replica in pairs:
            slots.acquire()
            if failed:
                slots.release()
                break
            t = threading.Thread(target=one, args=(client, replica), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            while t.is_alive():
                t.join(0.2)  # a Ctrl-C reaches the main thread
        if failed:
            self.not_started(pairs, f"the rollout stopped at {failed[0].url}")
            return failed[0].exit_code
        return EXIT_OK

    def apply_one(self, client: Client, replica: Replica, *, guard: bool) -> int:
        """Apply on one replica and follow it to its end; then confirm it serves through
        the router (when the daemon has one)."""
        started = time.monotonic()
        try:
            with OperationFollower(
                client, self.emit(replica), use_events=not self.args.poll
            ) as follower:
                follower.prepare()
                op = client.apply(
                    self.levers,
                    self.env,
                    drain_timeout_s=self.args.drain,
                    effect_guard=True if guard else None,
                )
                replica.op = final = follower.follow(op)
            replica.took_s = time.monotonic() - started
            state = str(final.get("state"))
            replica.outcome, replica.exit_code = state, outcome_exit(state)
            if state != "succeeded":
                replica.detail = str(final.get("rollback_reason") or final.get("error") or "")
                return replica.exit_code
            replica.detail = router_detail(client.status())
        except ClientError as exc:
            replica.took_s = time.monotonic() - started
            return failure(replica, exc)
        if replica.detail.startswith("NOT"):
            replica.outcome, replica.exit_code = "failed", outcome_exit("failed")
        elif guard:
            replica.detail = f"effect {effect_summary(final.get('effect'))}; {replica.detail}"
        return replica.exit_code

    def judge_canaries(self) -> int:
        """EXIT_OK when every canary's effect is measured and no worse."""
        unproven = [r for _, r in self.canaries if r.verdict not in PASSING]
        for r in unproven:
            r.detail = f"not proven no worse ({r.verdict}): {r.detail}"
        return EXIT_ROLLED_BACK if unproven else EXIT_OK

    def revert_canaries(self) -> None:
        """Every canary that committed goes back to its levers from before the rollout."""
        for client, replica in self.canaries:
            if replica.outcome != "succeeded":
                continue
            restore = self.restore_of(replica.op)
            if restore is None:
                replica.outcome, replica.exit_code = "failed", EXIT_FAILED
                replica.detail += (
                    "; NOT reverted: a changed lever's old value is secret (redacted by the "
                    "daemon): apply it by hand"
                )
                continue
            levers, env = restore
            try:
                with OperationFollower(
                    client, self.emit(replica), use_events=not self.args.poll
                ) as follower:
                    follower.prepare()
                    op = client.apply(levers, env, effect_guard=False)
                    final = follower.follow(op)
            except ClientError as exc:
                replica.outcome, replica.exit_code = "failed", EXIT_FAILED
                replica.detail += f"; NOT reverted: {exc}"
                continue
            if final.get("state") == "succeeded":
                replica.outcome, replica.exit_code = "reverted", EXIT_ROLLED_BACK
                replica.detail += "; its old levers serve again"
            else:
                replica.outcome, replica.exit_code = "failed", EXIT_FAILED
                why = final.get("rollback_reason") or final.get("error")
                replica.detail += f"; reverting it {final.get('state')}: {why}"

    def restore_of(self, op: Json) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The change that undoes this rollout's on a replica: each lever and env var
        it changed, at its value before the apply (null: unset); None when one of those
        values is secret (the daemon never shows it)."""
        before = op.get("levers_before") or {}
        old_levers = before.get("levers") or {}
        old_env = before.get("env") or {}
        levers = {k: old_levers.get(k) for k in self.levers}
        env = {k: old_env.get(k) for k in self.env}
        if REDACTED in (*levers.values(), *env.values()):
            return None
        return levers, env

    @staticmethod
    def not_started(pairs: list[tuple[Client, Replica]], why: str) -> None:
        for _, r in pairs:
            if r.outcome == "validated":
                r.outcome, r.detail = "not started", why


def router_detail(status: Json) -> str:
    router = status.get("router")
    if not isinstance(router, dict) or not router.get("url"):
        return "no router configured: its clients saw the restart"
    if router.get("registered") is True:
        return f"back in the router {router['url']} as {router.get('worker_url')}"
    return f"NOT in the router {router['url']}: {router.get('error') or 'not listed'}"
