"""The command line's exit codes (the same for every command) and its usage error.

0/2/3/4/5 keep their meaning from before 6 and 7 were split off 1 (scripts depend on them):
1 is now only "the daemon could not be asked" (down, a wrong address, a certificate this
CLI does not trust, no answer in time) or an error the daemon reported (a 5xx).
"""

from __future__ import annotations

from sglang_supervisor_api.cli.client_errors import ClientError, NotFound, Unauthorized

EXIT_OK = 0
#: The daemon unreachable (down, wrong address, its certificate not trusted), or another
#: error.
EXIT_ERROR = 1
#: Refused: invalid levers or bad usage; nothing was touched.
EXIT_INVALID = 2
EXIT_ROLLED_BACK = 3
EXIT_FAILED = 4
#: Another operation is running.
EXIT_BUSY = 5
#: The daemon refused the token: none given where one is needed, a wrong one (401), or
#: the read-only token for a call that changes something (403).
EXIT_UNAUTHORIZED = 6
#: What the command named does not exist on the daemon: an operation id, a launch's log.
EXIT_NOT_FOUND = 7
EXIT_INTERRUPTED = 130

#: An operation's final ``state`` -> the exit code.
OUTCOME_EXIT = {"succeeded": EXIT_OK, "rolled_back": EXIT_ROLLED_BACK, "failed": EXIT_FAILED}

EPILOG = (
    "exit codes: 0 done, 1 daemon unreachable (down, wrong address, certificate not "
    "trusted) or other error, 2 refused (invalid levers, bad usage), 3 rolled back, "
    "4 failed, 5 busy (another operation runs), 6 token missing or refused (401/403), "
    "7 not found (no such operation or launch log), 130 interrupted"
)


def outcome_exit(state: object) -> int:
    """The exit code of an operation that ended in ``state`` (1 when not a final state)."""
    return OUTCOME_EXIT.get(str(state), EXIT_ERROR)


def error_exit(exc: ClientError) -> int:
    """The exit code of a failed call to the daemon: 6 for a refused token, 7 for a thing
    the daemon does not have (not for a route an older daemon lacks: that is 1), else 1.
    The one rule; ``runner`` and ``rollout`` apply it."""
    if isinstance(exc, Unauthorized):
        return EXIT_UNAUTHORIZED
    if isinstance(exc, NotFound) and not exc.endpoint_missing:
        return EXIT_NOT_FOUND
    return EXIT_ERROR


class UsageError(Exception):
    """A bad command line or input file (exit 2); the message is one line."""
