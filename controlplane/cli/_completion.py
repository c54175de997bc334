"""``subagent-control completion bash|zsh``: a shell completion script, generated from the
parser itself, so it names every command and option the installed version has.

A generated script rather than argcomplete: completing needs no extra package and no
Python start per key press (argcomplete runs the program on every TAB), and what it
completes (commands, their options, files for paths) is static. Source it from the shell's
rc file: ``source <(subagent-control completion bash)``; zsh loads it through its
``bashcompinit``.
"""

from __future__ import annotations

import argparse
import shlex
from typing import IO

__all__ = ["completion_script"]


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``parser``'s command for ``shell`` (``bash`` or ``zsh``)."""
    commands = _commands(parser)
    top = " ".join(sorted([*commands, *_options(parser)]))
    cases = "\n".join(
        f"        {shlex.quote(name)}) words={shlex.quote(' '.join(sorted(options)))} ;;"
        for name, options in sorted(commands.items())
    )
    body = f"""_subagent_control() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} command="" words="" i
    for ((i = 1; i < COMP_CWORD; i++)); do
        case ${{COMP_WORDS[i]}} in -*) ;; *) command=${{COMP_WORDS[i]}}; break ;; esac
    done
    case $command in
        "") words={shlex.quote(top)} ;;
{cases}
    esac
    if [[ $cur != -* && -n $command ]]; then
        COMPREPLY=($(compgen -f -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$words" -- "$cur"))
    fi
}}
complete -o default -F _subagent_control subagent-control
"""
    if shell == "zsh":
        return "autoload -U +X bashcompinit && bashcompinit\n" + body
    return body


def run_completion(parser: argparse.ArgumentParser, shell: str, out: IO[str]) -> None:
    """Print ``shell``'s completion script."""
    out.write(completion_script(parser, shell))


def _commands(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {name: _options(sub) for name, sub in action.choices.items()}
    return {}


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [
        flag
        for action in parser._actions
        for flag in action.option_strings
        if flag.startswith("--") or flag in ("-h", "-v")
    ]
