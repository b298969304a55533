"""cmd.exe safety rules for `.cmd`/`.bat` launchers and the Windows tree-kill decision
(docs/design/scaler.md §6.1)."""

from __future__ import annotations

import pytest

from conveyor.scaler.windows_cmd import (
    LAUNCHER_REMEDY,
    UnsafeBatchToken,
    batch_command_refusals,
    batch_invocation,
    check_batch_command,
    cmd_exe_path,
    cmd_safety_refusal,
    is_batch_launcher,
    quote_token,
    taskkill_command,
)

USE = "the launcher"
REMEDY = "move it"

# (token, the character the refusal must name) — refused whether or not the token is quoted.
ALWAYS_REFUSED = [
    ("50%", "%"),
    ("%PATH%", "%"),
    ("a^b", "^"),
    ('say"hi', '"'),
    ("with space 50%", "%"),
    ("with space a^b", "^"),
    ('with space "q"', '"'),
    ("line\rbreak", "CR"),
    ("line\nbreak", "LF"),
    ("nul\0byte", "NUL"),
    ("with space\nand LF", "LF"),
]

# Refused without a space or tab (the token is not quoted), allowed once it has one.
UNQUOTED_ONLY = ["&", "|", "<", ">", "(", ")", ",", ";", "="]


@pytest.mark.parametrize(("token", "named"), ALWAYS_REFUSED)
def test_always_refused_characters_are_refused_and_named(token: str, named: str) -> None:
    message = cmd_safety_refusal(token, USE, REMEDY)
    assert message is not None
    assert f"cmd.exe would read '{named}' as syntax; {REMEDY}" in message
    assert message.startswith('cannot run "') and f"as {USE}:" in message


@pytest.mark.parametrize("char", UNQUOTED_ONLY)
def test_operator_characters_are_refused_in_an_unquoted_token(char: str) -> None:
    token = f"a{char}b"
    assert cmd_safety_refusal(token, USE, REMEDY) == (
        f"cannot run \"{token}\" as {USE}: cmd.exe would read '{char}' as syntax; {REMEDY}"
    )


@pytest.mark.parametrize("char", UNQUOTED_ONLY)
@pytest.mark.parametrize("blank", [" ", "\t"])
def test_operator_characters_are_allowed_in_a_token_quoted_for_its_space_or_tab(
    char: str, blank: str
) -> None:
    assert cmd_safety_refusal(f"a{char}b{blank}c", USE, REMEDY) is None


@pytest.mark.parametrize(
    "token",
    [
        "agent",
        "--ephemeral",
        r"C:\Conveyor\agent.cmd",
        r"C:\Conveyor Agents (x86)\agent.cmd",  # parentheses are fine once the space makes it quoted
        "k=v with space",
        "a&b c",
        "x(1) y",
        "unicode-é-ü",
        "!bang!",  # delayed expansion is pinned off with /v:off
        "trailing\\",
    ],
)
def test_accepted_tokens(token: str) -> None:
    assert cmd_safety_refusal(token, USE, REMEDY) is None


def test_the_examples_of_the_design_note() -> None:
    for token in ["a&b", "x(1)", "k=v"]:
        assert cmd_safety_refusal(token, USE, REMEDY) is not None
        assert cmd_safety_refusal(f"{token} with space", USE, REMEDY) is None
    for token, char in [("50%", "%"), ("a^b", "^"), ('say"hi', '"')]:
        message = cmd_safety_refusal(token, USE, REMEDY)
        assert message is not None and f"'{char}'" in message


def test_an_empty_token_is_refused() -> None:
    message = cmd_safety_refusal("", USE, REMEDY)
    assert message == f'cannot run "" as {USE}: cmd.exe would drop an empty argument; {REMEDY}'


def test_the_first_offending_character_is_named() -> None:
    message = cmd_safety_refusal("a&b%c", USE, REMEDY)
    assert message is not None and "'&'" in message and "'%'" not in message


def test_control_characters_are_spelled_out_in_the_message() -> None:
    message = cmd_safety_refusal("a\nb", USE, REMEDY)
    assert message is not None and "\n" not in message and '"a<LF>b"' in message


def test_a_quoted_space_argument_is_wrapped_in_quotes_only_when_it_needs_them() -> None:
    assert quote_token(r"C:\Conveyor Agents (x86)\agent.cmd") == r'"C:\Conveyor Agents (x86)\agent.cmd"'
    assert quote_token("tab\there") == '"tab\there"'
    assert quote_token("plain") == "plain"
    # cmd.exe does not treat backslash as an escape: a trailing one stays single (unlike list2cmdline).
    assert quote_token("C:\\dir with space\\") == '"C:\\dir with space\\"'


@pytest.mark.parametrize(
    ("program", "expected"),
    [("agent.cmd", True), ("AGENT.BAT", True), (r"C:\x\Run.Cmd", True), ("agent.exe", False), ("cmd", False)],
)
def test_batch_launchers_are_recognised_case_insensitively(program: str, expected: bool) -> None:
    assert is_batch_launcher(program) is expected


def test_a_launcher_runs_through_call_with_pinned_flags_and_quoted_spaces() -> None:
    environ = {"ComSpec": r"C:\Windows\system32\cmd.exe"}
    invocation = batch_invocation([r"C:\Conveyor Agents (x86)\agent.cmd", "--ephemeral"], environ)
    assert invocation.argv == [
        r"C:\Windows\system32\cmd.exe",
        "/d",
        "/e:on",
        "/v:off",
        "/c",
        "call",
        r"C:\Conveyor Agents (x86)\agent.cmd",
        "--ephemeral",
    ]
    assert invocation.command_line == (
        r'C:\Windows\system32\cmd.exe /d /e:on /v:off /c call "C:\Conveyor Agents (x86)\agent.cmd" --ephemeral'
    )


def test_an_unsafe_launcher_command_is_refused_with_every_token_named() -> None:
    with pytest.raises(UnsafeBatchToken) as raised:
        batch_invocation([r"C:\50%\agent.cmd", "a&b", "fine"], {})
    message = str(raised.value)
    assert r'cannot run "C:\50%\agent.cmd" as the launcher' in message and LAUNCHER_REMEDY in message
    assert 'cannot run "a&b" as launcher argument 1' in message
    assert "fine" not in message


def test_a_safe_command_passes_the_check() -> None:
    check_batch_command([r"C:\agents\run.bat", "--labels", "windows x64"])
    assert batch_command_refusals([r"C:\agents\run.bat"]) == []


def test_an_empty_command_is_refused() -> None:
    assert batch_command_refusals([]) == ["the command is empty; give the launcher path as its first item"]


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"COMSPEC": r"D:\Win\System32\CMD.EXE"}, r"D:\Win\System32\CMD.EXE"),
        ({"COMSPEC": r"C:\tools\tcc.exe", "SystemRoot": r"D:\Win"}, r"D:\Win\System32\cmd.exe"),
        ({"SYSTEMROOT": r"E:\Windows"}, r"E:\Windows\System32\cmd.exe"),
        ({}, r"C:\Windows\System32\cmd.exe"),
    ],
)
def test_cmd_exe_is_comspec_only_when_it_names_cmd_exe(environ: dict[str, str], expected: str) -> None:
    assert cmd_exe_path(environ) == expected


def test_taskkill_ends_the_tree_while_the_child_is_still_running() -> None:
    assert taskkill_command(4242, None) == ["taskkill", "/PID", "4242", "/T", "/F"]


@pytest.mark.parametrize("returncode", [0, 1, -9, 3221225786])
def test_nothing_is_run_once_the_childs_exit_was_observed(returncode: int) -> None:
    assert taskkill_command(4242, returncode) is None
