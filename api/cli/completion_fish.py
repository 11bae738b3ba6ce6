"""``sglang-supervisor completion fish``: fish's ``complete`` lines, generated from the
command line's parser as the bash script is: each command with its help, each command's
options with theirs, files after options that take a path, choices, and lever names after
``--set`` (as ``NAME=``) and ``--unset``, written into the script (no program runs on a
TAB). shtab, which writes the bash and zsh scripts, has no fish.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sglang_supervisor_api.cli.completion import PROG

LEVERS_FUNCTION = "__sglang_supervisor_levers"


def fish_quote(text: str) -> str:
    """``text`` as one fish single-quoted word (fish knows only ``\\\\`` and ``\\'`` there)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _help(action: argparse.Action) -> str:
    text = " ".join(str(action.help or "").split())
    return text.replace("%%", "%")


def _option_line(condition: str, action: argparse.Action) -> str | None:
    """The ``complete`` line of one option (None for a hidden one)."""
    if action.help == argparse.SUPPRESS:
        return None
    parts = [f"complete -c {PROG}", f"-n {fish_quote(condition)}"]
    for opt in action.option_strings:
        parts.append(f"-l {opt[2:]}" if opt.startswith("--") else f"-s {opt[1:]}")
    takes_value = action.nargs != 0
    if takes_value:
        if "--set" in action.option_strings:
            levers = f"({LEVERS_FUNCTION} | string replace -r '$' '=')"
            parts += ["-x", "-a", fish_quote(levers)]
        elif "--unset" in action.option_strings:
            parts += ["-x", "-a", fish_quote(f"({LEVERS_FUNCTION})")]
        elif action.choices:
            parts += ["-x", "-a", fish_quote(" ".join(str(c) for c in action.choices))]
        elif action.type is Path:
            parts += ["-r", "-F"]  # a file
        else:
            parts.append("-x")  # a value that is not a file
    if help_text := _help(action):
        parts += ["-d", fish_quote(help_text)]
    return " ".join(parts)


def fish_script(parser: argparse.ArgumentParser, names: list[str]) -> str:
    """The fish completion script for ``parser``, ``names`` after ``--set``/``--unset``
    (identifiers: ``lever_names`` drops anything else)."""
    sub_action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: _help(a) for a in sub_action._choices_actions}
    lines = [
        f"function {LEVERS_FUNCTION}",
        "    printf '%s\\n' " + " ".join(fish_quote(n) for n in names),
        "end",
        f"complete -c {PROG} -f",  # no file names unless an option takes a path
    ]
    top = "__fish_use_subcommand"
    for action in parser._actions:
        if action.option_strings and (line := _option_line(top, action)):
            lines.append(line)
    for name, sub in sub_action.choices.items():
        described = f" -d {fish_quote(helps[name])}" if helps.get(name) else ""
        lines.append(f"complete -c {PROG} -n {top} -a {name}{described}")
        condition = f"__fish_seen_subcommand_from {name}"
        for action in sub._actions:
            if action.option_strings:
                if line := _option_line(condition, action):
                    lines.append(line)
            elif action.choices:  # a positional with choices (completion's shell...)
                words = fish_quote(" ".join(str(c) for c in action.choices))
                lines.append(f"complete -c {PROG} -n {fish_quote(condition)} -a {words}")
    return "\n".join(lines) + "\n"
