"""Running `.cmd`/`.bat` agent launchers through cmd.exe, and ending Windows process trees (pure).

cmd.exe does not parse its command line the way CreateProcess/CRT programs do: `%` expands variables even
inside quotes, `^` escapes, `"` toggles quoting, and outside quotes `& | < > ( )` are operators and `, ; =`
separate batch arguments. No quoting scheme makes those safe across `call`, so a launcher or argument holding
one is refused with a message that names the character and the fix (`docs/design/scaler.md` §6.1). What
remains is plain: a token is quoted only when it holds a space or tab, and because `"` is refused it never
needs escaping.

Everything here is I/O-free so the rules are tested on every OS; the bare-metal backend applies them on Windows.
"""

from __future__ import annotations

import ntpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from conveyor.errors import ConveyorError

BATCH_SUFFIXES = (".cmd", ".bat")
# Flags pinned on every cmd.exe invocation: /d skips AutoRun, /e:on and /v:off fix command extensions and
# delayed expansion whatever the registry says; `call` keeps the launcher out of the slot where /c strips quotes.
CMD_FLAGS = ("/d", "/e:on", "/v:off", "/c", "call")

ALWAYS_REFUSED = frozenset('%^"\r\n\0')
REFUSED_UNQUOTED = frozenset("&|<>(),;=")
QUOTE_TRIGGERS = frozenset(" \t")

LAUNCHER_REMEDY = "move the launcher to a path without these characters"
ARGUMENT_REMEDY = "remove the character from the argument, or pass the value through the label set's env"

_CHAR_NAMES = {"\r": "CR", "\n": "LF", "\0": "NUL", "\t": "TAB"}


class UnsafeBatchToken(ConveyorError, ValueError):
    """A launcher command cmd.exe would misread; the message names the token, the character and the fix."""


@dataclass(frozen=True)
class BatchInvocation:
    """How to start a batch launcher: `argv` for display and `command_line` for CreateProcess, verbatim."""

    argv: list[str]
    command_line: str


def is_batch_launcher(program: str) -> bool:
    """Whether `program` (a command's first token) is a `.cmd`/`.bat` file, case-insensitively."""
    return program.lower().endswith(BATCH_SUFFIXES)


def needs_quotes(token: str) -> bool:
    """A token is quoted only when it contains a space or a tab."""
    return any(char in QUOTE_TRIGGERS for char in token)


def quote_token(token: str) -> str:
    """The token as cmd.exe should see it: wrapped in double quotes iff it holds a space or tab.

    Backslashes are left alone (cmd.exe does not treat them as escapes, unlike the CRT rules of
    `subprocess.list2cmdline`, which would double a trailing backslash before the closing quote).
    """
    return f'"{token}"' if needs_quotes(token) else token


def _display(text: str) -> str:
    """A token or character with control characters spelled out, fit for one line of a message."""
    return "".join(f"<{_CHAR_NAMES[c]}>" if c in "\r\n\0" else c for c in text)


def _char_name(char: str) -> str:
    return _CHAR_NAMES.get(char, char)


def cmd_safety_refusal(token: str, use: str, remedy: str) -> str | None:
    """Why cmd.exe cannot be trusted with `token` used as `use` (e.g. "the launcher"), or None when it is safe.

    Refused: `%`, `^`, `"`, CR, LF or NUL anywhere; `& | < > ( ) , ; =` in a token that will not be quoted
    (no space or tab); an empty token (cmd.exe drops it). The first offending character in the token is named.
    """
    if token == "":
        return f'cannot run "" as {use}: cmd.exe would drop an empty argument; {remedy}'
    quoted = needs_quotes(token)
    for char in token:
        if char in ALWAYS_REFUSED or (not quoted and char in REFUSED_UNQUOTED):
            return (
                f'cannot run "{_display(token)}" as {use}: '
                f"cmd.exe would read '{_char_name(char)}' as syntax; {remedy}"
            )
    return None


def batch_command_refusals(command: Sequence[str]) -> list[str]:
    """Every refusal for a batch launcher command (`command[0]` the launcher, the rest its arguments)."""
    refusals: list[str] = []
    for index, token in enumerate(command):
        if index == 0:
            refusal = cmd_safety_refusal(token, "the launcher", LAUNCHER_REMEDY)
        else:
            refusal = cmd_safety_refusal(token, f"launcher argument {index}", ARGUMENT_REMEDY)
        if refusal is not None:
            refusals.append(refusal)
    if not command:
        refusals.append("the command is empty; give the launcher path as its first item")
    return refusals


def check_batch_command(command: Sequence[str]) -> None:
    """Raise `UnsafeBatchToken` naming every unsafe token of a batch launcher command."""
    refusals = batch_command_refusals(command)
    if refusals:
        raise UnsafeBatchToken("; ".join(refusals))


def cmd_exe_path(environ: Mapping[str, str]) -> str:
    """`COMSPEC` when its basename is `cmd.exe`, else `%SystemRoot%\\System32\\cmd.exe`.

    A COMSPEC pointing at another shell would not understand the flags below, so it is not trusted blindly.
    """
    env = {name.upper(): value for name, value in environ.items()}  # Windows names are case-insensitive
    comspec = env.get("COMSPEC", "")
    if comspec and ntpath.basename(comspec).lower() == "cmd.exe":
        return comspec
    system_root = env.get("SYSTEMROOT") or r"C:\Windows"
    return ntpath.join(system_root, "System32", "cmd.exe")


def batch_invocation(command: Sequence[str], environ: Mapping[str, str]) -> BatchInvocation:
    """The cmd.exe invocation of a batch launcher command, after refusing unsafe tokens.

    The launcher's stdin must be NUL (the caller's job) so "Terminate batch job (Y/N)?" reads end-of-input.
    """
    check_batch_command(command)
    argv = [cmd_exe_path(environ), *CMD_FLAGS, *command]
    return BatchInvocation(argv=argv, command_line=" ".join(quote_token(token) for token in argv))


def taskkill_command(pid: int, returncode: int | None) -> list[str] | None:
    """The command that ends a Windows agent's process tree, or None when nothing may be run.

    Only while the child is still running (`returncode is None`: our handle is open, so the pid is still
    ours). Once its exit was observed the pid may belong to an unrelated process whose tree `/T` would end.
    """
    if returncode is not None:
        return None
    return ["taskkill", "/PID", str(pid), "/T", "/F"]
