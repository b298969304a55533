"""Status badges: a run's status in badge words, and the SVG (docs/design/execution.md §11)."""

import re
import xml.etree.ElementTree as ET

from hypothesis import given
from hypothesis import strategies as st

from conveyor.ingest.badge_svg import (
    GREEN,
    GREY,
    MAX_TEXT_CHARS,
    NO_RUNS,
    ORANGE,
    RED,
    BadgeStatus,
    badge_status,
    render_badge,
    shown_text,
)

SVG = "{http://www.w3.org/2000/svg}"


def _texts(svg: str) -> list[str]:
    return [t.text or "" for t in ET.fromstring(svg).iter(f"{SVG}text")]


def _width(svg: str) -> int:
    return int(ET.fromstring(svg).attrib["width"])


def test_each_finished_status_has_its_words_and_colour() -> None:
    assert badge_status("success") == BadgeStatus("passing", GREEN)
    assert badge_status("failed", "step_failed: build") == BadgeStatus("failing", RED)
    assert badge_status("cancelled", "cancelled_by") == BadgeStatus("cancelled", GREY)


def test_a_run_ended_by_the_workflow_timeout_reads_timed_out() -> None:
    assert badge_status("failed", "workflow_timeout") == BadgeStatus("timed out", ORANGE)


def test_no_finished_run_reads_no_runs() -> None:
    assert badge_status(None) == NO_RUNS == BadgeStatus("no runs", GREY)


def test_the_badge_names_the_workflow_and_the_status() -> None:
    svg = render_badge("ci", badge_status("success"))
    assert _texts(svg) == ["ci", "passing"]
    assert 'aria-label="ci: passing"' in svg and GREEN in svg


def test_markup_in_a_workflow_name_is_text_not_markup() -> None:
    svg = render_badge('<script>alert("x")</script>&', badge_status("failed"))
    assert "<script" not in svg
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;" in svg
    root = ET.fromstring(svg)  # still a well-formed document
    assert [e.tag for e in root.iter() if not e.tag.startswith(SVG)] == []
    assert _texts(svg)[0] == '<script>alert("x")</script>&'


def test_the_width_grows_with_the_text() -> None:
    short = render_badge("ci", NO_RUNS)
    long = render_badge("integration-tests-on-every-platform", NO_RUNS)
    assert _width(long) > _width(short) + 150
    assert _width(render_badge("mmmm", NO_RUNS)) > _width(render_badge("iiii", NO_RUNS))


def test_a_long_name_is_cut_with_an_ellipsis() -> None:
    shown = shown_text("x" * 500)
    assert len(shown) == MAX_TEXT_CHARS and shown.endswith("…")


@given(st.text(max_size=200))
def test_any_name_gives_a_well_formed_badge_showing_it(name: str) -> None:
    svg = render_badge(name, badge_status("success"))
    assert _texts(svg)[0] == shown_text(name)
    assert re.fullmatch(r"\d+", ET.fromstring(svg).attrib["width"])
