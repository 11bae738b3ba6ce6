"""Commands that look without changing anything: status, levers, schema, logs, events."""

from __future__ import annotations

import argparse
import json
import sys
import time

from sglang_supervisor_api.cli.client import Client, LogText
from sglang_supervisor_api.cli.client_errors import ClientError, NotFound
from sglang_supervisor_api.cli.event_stream import open_event_stream
from sglang_supervisor_api.cli.exits import EXIT_ERROR, EXIT_OK, UsageError
from sglang_supervisor_api.cli.follow import SeqFilter
from sglang_supervisor_api.cli.output import err, out, print_json, show
from sglang_supervisor_api.cli.render import render_levers, render_schema, render_status
from sglang_supervisor_api.cli.render_live import render_event
from sglang_supervisor_api.cli.server_log import new_lines
from sglang_supervisor_api.cli.text import terminal_width


def cmd_status(args: argparse.Namespace, client: Client) -> int:
    """Show the daemon's state (since when, and why), the server, the levers (marking
    those that differ from the last-good set), per-GPU memory with member and foreign
    process counts, the running operation, restarts and throughput."""
    data = client.status()
    show(data, render_status, as_json=args.json)
    return EXIT_OK


def cmd_levers(args: argparse.Namespace, client: Client) -> int:
    """Show the current levers and env beside the last-good ones (differences marked)."""
    data = client.levers()
    show(data, render_levers, as_json=args.json)
    return EXIT_OK


def cmd_schema(args: argparse.Namespace, client: Client) -> int:
    """List the installed SGLang's flags (those mentioning WORD; with --live only those
    SGLang changes on a running server): dest, option, type, default, choices, help and
    how a running server takes it. Exit 1 when no flag matches."""
    data = client.schema(args.word)
    if getattr(args, "live", False):  # only the flags SGLang changes on a running server
        live = [f for f in data.get("flags") or [] if isinstance(f, dict) and f.get("live_via")]
        data = {**data, "flags": live, "count": len(live)}
    if args.json:
        print_json(data)
    elif not data.get("flags"):
        if getattr(args, "live", False):
            about = f"mentioning {args.word!r} " if args.word else ""
            err(f"no SGLang flag {about}changes live")
        else:
            err(f"no SGLang flag mentions {args.word!r}")
    else:
        out(render_schema(data, args.word))
    return EXIT_OK if data.get("flags") else EXIT_ERROR


def cmd_logs(args: argparse.Namespace, client: Client) -> int:
    """Print the server's last N log lines (of launch K: 0 = current, 1 = previous...);
    with -f keep printing new lines until Ctrl-C."""
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
    first: LogText | None
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


def _follow_logs(
    args: argparse.Namespace, client: Client, first: LogText | None, window: int
) -> int:
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


def cmd_events(args: argparse.Namespace, client: Client) -> int:
    """Print the daemon's events as they happen (state transitions, operation phases,
    per-GPU memory during release, launches) until Ctrl-C. A stream that breaks is
    reopened (events in between come back from the daemon's recent history)."""
    width = terminal_width() if sys.stdout.isatty() else None
    seen = SeqFilter()
    replay = bool(args.replay)
    try:
        while True:
            # The daemon sends a keep-alive every 15 s: silence for 45 s is a dead stream.
            with open_event_stream(client, replay=replay, read_timeout_s=45) as stream:
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
