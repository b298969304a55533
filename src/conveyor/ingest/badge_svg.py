"""A status badge as SVG: a run's status in badge words and the image itself (docs/design/execution.md §11).

Pure functions; `badges.py` reads the run and answers. The SVG is a hand-written template, not a library:
every interpolated string goes through `_text`, which XML-escapes it, so a workflow name such as
`<script>` (it comes from the URL too) is shown as text and never becomes markup.
"""

from __future__ import annotations

from html import escape
from typing import NamedTuple

GREEN = "#4c1"
RED = "#e05d44"
ORANGE = "#fe7d37"
GREY = "#9f9f9f"
LABEL_GREY = "#555"

# A badge is one line: a longer name is cut (with an ellipsis) so the image stays a badge.
MAX_TEXT_CHARS = 60
PADDING_PX = 6
HEIGHT_PX = 20

# Widths in px of Verdana 11 px, the badge's first font, for the characters that differ much from the
# default of their kind; an estimate is enough (the text is centred in its box).
_NARROW = dict.fromkeys("fijlrt.,:;!|'`()[]{} ", 4.0)
_WIDE = {"m": 10.7, "w": 9.0, "M": 10.0, "W": 11.2, "@": 11.0, "%": 12.0}
_LOWER_PX, _UPPER_PX, _OTHER_PX, _CJK_PX = 6.8, 7.6, 7.0, 11.0


class BadgeStatus(NamedTuple):
    """What the badge's right half says and its colour."""

    message: str
    colour: str


NO_RUNS = BadgeStatus("no runs", GREY)


def badge_status(status: str | None, reason: str | None = None) -> BadgeStatus:
    """The badge for a finished run's `status` and `reason` (None: no finished run)."""
    if status is None:
        return NO_RUNS
    if status == "success":
        return BadgeStatus("passing", GREEN)
    if status == "failed":
        # The workflow's own deadline ends the run `failed` with this reason (docs/design/execution.md §4).
        if (reason or "").startswith("workflow_timeout"):
            return BadgeStatus("timed out", ORANGE)
        return BadgeStatus("failing", RED)
    if status == "cancelled":
        return BadgeStatus("cancelled", GREY)
    return BadgeStatus(status.replace("_", " "), GREY)


def shown_text(text: str) -> str:
    """`text` as the badge prints it: without control characters (XML 1.0 forbids most), cut to
    `MAX_TEXT_CHARS`."""
    printable = "".join(c if c.isprintable() else " " for c in text).strip() or "?"
    if len(printable) > MAX_TEXT_CHARS:
        return printable[: MAX_TEXT_CHARS - 1] + "…"
    return printable


def text_width(text: str) -> float:
    """An estimate of `text`'s width in px, in Verdana 11 px."""
    total = 0.0
    for c in text:
        if c in _NARROW:
            total += _NARROW[c]
        elif c in _WIDE:
            total += _WIDE[c]
        elif ord(c) >= 0x2E80:  # CJK and later: full-width glyphs
            total += _CJK_PX
        elif c.islower():
            total += _LOWER_PX
        elif c.isupper():
            total += _UPPER_PX
        else:
            total += _OTHER_PX
    return total


def _text(value: str) -> str:
    return escape(value, quote=True)


def render_badge(label: str, status: BadgeStatus) -> str:
    """The SVG of a badge reading `label` on the left and `status` on the right."""
    label, message = shown_text(label), shown_text(status.message)
    left = round(text_width(label) + 2 * PADDING_PX)
    right = round(text_width(message) + 2 * PADDING_PX)
    width = left + right
    title = _text(f"{label}: {message}")
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{HEIGHT_PX}" role="img" '
        f'aria-label="{title}">'
        f"<title>{title}</title>"
        '<linearGradient id="s" x2="0" y2="100%"><stop offset="0" stop-color="#bbb" stop-opacity=".1"/>'
        '<stop offset="1" stop-opacity=".1"/></linearGradient>'
        f'<clipPath id="r"><rect width="{width}" height="{HEIGHT_PX}" rx="3" fill="#fff"/></clipPath>'
        '<g clip-path="url(#r)">'
        f'<rect width="{left}" height="{HEIGHT_PX}" fill="{LABEL_GREY}"/>'
        f'<rect x="{left}" width="{right}" height="{HEIGHT_PX}" fill="{_text(status.colour)}"/>'
        f'<rect width="{width}" height="{HEIGHT_PX}" fill="url(#s)"/></g>'
        '<g fill="#fff" text-anchor="middle" font-family="Verdana,Geneva,DejaVu Sans,sans-serif" '
        'font-size="11">'
        f'<text x="{left / 2:g}" y="14">{_text(label)}</text>'
        f'<text x="{left + right / 2:g}" y="14">{_text(message)}</text></g></svg>'
    )
