"""The command line's exit codes (the same for every command) and its usage error."""

from __future__ import annotations

EXIT_OK = 0
#: The daemon unreachable, or another error.
EXIT_ERROR = 1
#: Refused: invalid levers or bad usage; nothing was touched.
EXIT_INVALID = 2
EXIT_ROLLED_BACK = 3
EXIT_FAILED = 4
#: Another operation is running.
EXIT_BUSY = 5
EXIT_INTERRUPTED = 130

#: An operation's final ``state`` -> the exit code.
OUTCOME_EXIT = {"succeeded": EXIT_OK, "rolled_back": EXIT_ROLLED_BACK, "failed": EXIT_FAILED}

EPILOG = (
    "exit codes: 0 done, 1 daemon unreachable or other error, 2 refused (invalid levers, "
    "bad usage), 3 rolled back, 4 failed, 5 busy (another operation runs), 130 interrupted"
)


def outcome_exit(state: object) -> int:
    """The exit code of an operation that ended in ``state`` (1 when not a final state)."""
    return OUTCOME_EXIT.get(str(state), EXIT_ERROR)


class UsageError(Exception):
    """A bad command line or input file (exit 2); the message is one line."""
