"""ANSI colours in log lines as HTML (conveyor.dashboard.ansi): the vectors here are the specification
the page's script is checked against too (tests/e2e/test_dashboard_logs_browser.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.dashboard.ansi import render_ansi

VECTORS: list[dict[str, Any]] = json.loads((Path(__file__).parent / "ansi_vectors.json").read_text())
# What the renderer may emit: its own span tags (classes and #rrggbb colours), entities, text.
OWN_TAG = re.compile(
    r'<span(?: class="(?:ansi-[a-z]+(?:-\d+)?)(?: ansi-[a-z]+(?:-\d+)?)*")?'
    r'(?: data-fg="#[0-9a-f]{6}")?(?: data-bg="#[0-9a-f]{6}")?>|</span>'
)


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_a_vector_renders_as_specified(vector: dict[str, Any]) -> None:
    assert render_ansi(vector["input"]) == vector["html"]


def test_the_vectors_cover_the_issue_s_cases() -> None:
    names = " ".join(v["name"] for v in VECTORS)
    for needed in ("script", "truecolour", "256", "OSC", "cursor", "malformed", "reset", "bold"):
        assert needed.lower() in names.lower(), needed


def test_a_red_line_is_a_span_and_not_an_escape() -> None:
    html = render_ansi("\x1b[31mFAILED\x1b[0m tests/test_x.py")
    assert html == '<span class="ansi-fg-1">FAILED</span> tests/test_x.py'
    assert "\x1b" not in html and "[31m" not in html


def test_script_in_a_log_is_escaped_text() -> None:
    assert render_ansi("<script>alert(1)</script>") == "&lt;script&gt;alert(1)&lt;/script&gt;"


def _control_free(text: str) -> bool:
    return not any((ord(c) < 0x20 and c != "\t") or 0x7F <= ord(c) <= 0x9F for c in text)


LOGGY = st.text(
    alphabet=st.sampled_from(
        [
            "\x1b",
            "[",
            "]",
            ";",
            ":",
            "m",
            "3",
            "8",
            "5",
            "2",
            "1",
            "0",
            "9",
            "<",
            ">",
            "&",
            '"',
            "'",
            "\x07",
            "\\",
            "\r",
            "\x9b",
            "\x9d",
            "a",
            "é",
            "\xa0",
            "?",
            "H",
            "K",
            "(",
            "B",
            " ",
            "\t",
        ]
    ),
    max_size=60,
)


@given(LOGGY)
def test_any_line_yields_only_the_renderer_s_own_markup(line: str) -> None:
    html = render_ansi(line)
    text = OWN_TAG.sub("", html)
    assert "<" not in text and ">" not in text
    assert re.fullmatch(r"(?:[^&]|&(?:amp|lt|gt|nbsp);)*", text), text
    assert _control_free(text)
    assert html.count("<span") == html.count("</span>")


@given(st.text(max_size=80))
def test_text_without_escapes_round_trips_escaped(line: str) -> None:
    if any(c in line for c in "\x1b\x9b\x9d\r") or not _control_free(line):
        return
    expected = line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\xa0", "&nbsp;")
    assert render_ansi(line) == expected
