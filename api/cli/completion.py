"""``sglang-supervisor completion bash|zsh|fish``: a static shell completion script, generated
from the command line's own parser (so it never drifts from it): commands, options, choices,
files after options that take a path, and lever names after ``--set`` / ``--unset``. No
Python runs on a TAB: the lever names are written into the script when it is generated —
the daemon's schema when it answers then (``GET /levers/schema``: the flags of the SGLang it
runs), else the bundled one (``lever_names``); generate it again after an SGLang upgrade.

Install: ``sglang-supervisor completion bash > /etc/bash_completion.d/sglang-supervisor``
(or ``source <(sglang-supervisor completion bash)`` in ``~/.bashrc``); zsh: ``completion
zsh > "${fpath[1]}/_sglang-supervisor"``; fish: ``sglang-supervisor completion fish >
~/.config/fish/completions/sglang-supervisor.fish``.

bash and zsh come from shtab (the parser walked by a maintained library: zsh gets its own
``_arguments`` completion, no longer bash's through ``bashcompinit``); shtab has no fish,
so fish keeps the generator of ``completion_fish``. Not argcomplete: it runs this Python
program on every TAB (the whole CLI imported).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

PROG = "sglang-supervisor"
#: The bash function a shell calls (shtab's, wrapped: ``NAME=`` after ``--set`` takes no
#: space, so the value follows).
FUNCTION = "_sglang_supervisor"
SHELLS = ("bash", "zsh", "fish")
#: Options whose value is a lever name (``--set`` takes ``NAME=VALUE``).
LEVER_OPTIONS = ("--set", "--unset")


def add_completion_parser(sub: Any) -> None:
    p = sub.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh, fish)",
        description="\n\n".join(__doc__.strip().split("\n\n")[1:3]) if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("shell", nargs="?", choices=SHELLS, help="the shell to complete in")
    p.add_argument(
        "--lever-names",
        action="store_true",
        help="print the lever names, one a line (the daemon's schema, else the bundled one)",
    )


def run_completion(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Print the script for ``args.shell``, or the lever names (``--lever-names``)."""
    from sglang_supervisor_api.cli.lever_names import lever_names

    if args.lever_names:
        print("\n".join(lever_names()[0]))
        return 0
    if args.shell is None:
        parser.error("completion: give the shell (bash, zsh or fish), or --lever-names")
    names, source = lever_names()
    print(completion_script(parser, args.shell, names, source), end="")
    return 0


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every command's parser."""
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            out += list(action.choices.values())
    return out


def _bash_preamble(names: list[str]) -> str:
    # The names are identifiers (lever_names drops anything else): compgen -W expands its
    # word list, so nothing else may reach it.
    words = " ".join(names)
    return "\n".join(
        [
            f'_sglang_supervisor_lever_names="{words}"',
            "_sglang_supervisor_levers() {",
            '  compgen -W "$_sglang_supervisor_lever_names" -- "$1"',
            "}",
            "_sglang_supervisor_levers_assign() {",
            '  compgen -S = -W "$_sglang_supervisor_lever_names" -- "$1"',
            "}",
        ]
    )


def _bash_wrapper() -> str:
    return "\n".join(
        [
            "",
            f"{FUNCTION}() {{",
            f'  _shtab{FUNCTION} "$@"  # shtab\'s function for {PROG}',
            "  # after --set a lever name ends in '=': its value follows without a space",
            '  if [[ "${COMP_WORDS[COMP_CWORD-1]}" == --set && ${#COMPREPLY[@]} -gt 0 ]]; then',
            "    compopt -o nospace 2>/dev/null",
            "  fi",
            "  return 0",
            "}",
            f"complete -o bashdefault -F {FUNCTION} {PROG}",
            "",
        ]
    )


def _zsh_preamble(names: list[str]) -> str:
    words = " ".join(names)
    return "\n".join(
        [
            f"_sglang_supervisor_lever_names=({words})",
            "_sglang_supervisor_levers() {",
            "  compadd -- $_sglang_supervisor_lever_names",
            "}",
            "_sglang_supervisor_levers_assign() {",
            "  compadd -S = -- $_sglang_supervisor_lever_names",
            "}",
        ]
    )


def completion_script(
    parser: argparse.ArgumentParser, shell: str, names: list[str], source: str = "bundled"
) -> str:
    """The script for ``shell``, with ``names`` after ``--set``/``--unset`` (``source``:
    where they came from, said in its header)."""
    header = (
        f"# {shell} completion for {PROG} (generated by `{PROG} completion {shell}`); "
        f"lever names from the {'daemon' if source == 'daemon' else 'bundled'} schema\n"
    )
    if shell == "fish":
        from sglang_supervisor_api.cli.completion_fish import fish_script

        return header + fish_script(parser, names)
    import shtab

    for p in _parsers(parser):
        for action in p._actions:
            if "--set" in action.option_strings:
                action.complete = {  # type: ignore[attr-defined]
                    "bash": "_sglang_supervisor_levers_assign",
                    "zsh": "_sglang_supervisor_levers_assign",
                }
            elif "--unset" in action.option_strings:
                action.complete = {  # type: ignore[attr-defined]
                    "bash": "_sglang_supervisor_levers",
                    "zsh": "_sglang_supervisor_levers",
                }
            elif action.option_strings and action.type is Path:
                action.complete = shtab.FILE  # type: ignore[attr-defined]
    if shell == "zsh":
        body: str = shtab.complete(parser, "zsh", preamble=_zsh_preamble(names))
        first, _, rest = body.partition("\n")  # "#compdef ...": zsh reads the first line
        return f"{first}\n{header}{rest}\n"
    body = shtab.complete(parser, "bash", preamble=_bash_preamble(names))
    return header + body + "\n" + _bash_wrapper()
