"""A log line's ANSI colours as HTML: SGR escapes become spans, everything from the log is escaped.

Pure (no I/O). `static/app.js` renders streamed lines with a port of this function; both are checked
against the same vectors (`tests/data/ansi_vectors.json`), so a live line and a reloaded one look alike.

- The 16 basic colours (30–37, 90–97, 40–47, 100–107, and 38;5 / 48;5 with an index below 16) become
  classes (`ansi-fg-9`), so the theme picks the shades.
- 256-colour indices from 16 and truecolour (38;2;r;g;b) become `data-fg="#rrggbb"` / `data-bg`: the
  Content-Security-Policy forbids `style` attributes, so the page's script copies them into the
  element's style (which the policy allows). The value is built here from integers, never from the log.
- Bold, dim, italic, underline and strike-through become classes; 0 (or an empty SGR) resets.
- Every other escape sequence (cursor moves, erase, OSC titles and hyperlinks, charset selection) and
  every other control character is dropped; a carriage return starts the line over, as a terminal
  shows a progress bar's last state.
- Each line renders on its own (no state carries over a newline): a streamed line and a line found by a
  search or an anchor look the same as when the whole log is rendered.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

ESC = "\x1b"
CSI_C1 = "\x9b"
OSC_C1 = "\x9d"
BEL = "\x07"
_FLAGS = ("bold", "dim", "italic", "underline", "strike")
_SET_FLAG = {1: "bold", 2: "dim", 3: "italic", 4: "underline", 9: "strike"}
_CLEAR_FLAGS = {22: ("bold", "dim"), 23: ("italic",), 24: ("underline",), 29: ("strike",)}
_CUBE = (0, 95, 135, 175, 215, 255)


@dataclass(frozen=True)
class Style:
    """The SGR state of a piece of text; a colour is an index 0–15 (a class) or `#rrggbb`."""

    bold: bool = False
    dim: bool = False
    italic: bool = False
    underline: bool = False
    strike: bool = False
    fg: int | str | None = None
    bg: int | str | None = None


PLAIN = Style()


def _escape(text: str) -> str:
    # The same escapes a browser's innerHTML serialisation uses for text, so the JS port's output
    # compares equal character for character.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\xa0", "&nbsp;")


def _hex(red: int, green: int, blue: int) -> str:
    return f"#{red:02x}{green:02x}{blue:02x}"


def _indexed(index: int) -> int | str:
    """A 256-colour index: 0–15 stay indices (classes), the cube and the greys become `#rrggbb`."""
    if index < 16:
        return index
    if index < 232:
        cube = index - 16
        return _hex(_CUBE[cube // 36], _CUBE[(cube // 6) % 6], _CUBE[cube % 6])
    grey = 8 + 10 * (index - 232)
    return _hex(grey, grey, grey)


def _extended(values: list[int | None]) -> tuple[int | str | None, int]:
    """The colour after a 38/48 and how many of `values` it used; None when it is malformed."""
    if not values:
        return None, 0
    mode = values[0]
    if mode == 5:
        if len(values) < 2:
            return None, len(values)
        index = values[1]
        return (_indexed(index) if index is not None and index <= 255 else None), 2
    if mode == 2:
        if len(values) < 4:
            return None, len(values)
        rgb = values[1:4]
        if any(v is None or v > 255 for v in rgb):
            return None, 4
        red, green, blue = (int(v or 0) for v in rgb)
        return _hex(red, green, blue), 4
    return None, 1


def _sub_colour(parts: list[str]) -> int | str | None:
    """A colon form such as `38:5:196`, `38:2:255:0:0` or `38:2::255:0:0` (with a colour space id)."""
    try:
        values = [int(p) if p else None for p in parts[1:]]
    except ValueError:
        return None
    if values and values[0] == 2 and len(values) == 5:
        values = [2, *values[2:]]  # drop the colour space id
    colour, used = _extended(values)
    return colour if used == len(values) else None


def _coloured(style: Style, foreground: bool, colour: int | str) -> Style:
    return replace(style, fg=colour) if foreground else replace(style, bg=colour)


def apply_sgr(style: Style, params: str) -> Style:
    """The style after `ESC [ params m`."""
    if params == "":
        return PLAIN
    groups = params.split(";")
    values: list[int | None] = []
    colon_groups: dict[int, list[str]] = {}
    for group in groups:
        if ":" in group:
            colon_groups[len(values)] = group.split(":")
            values.append(None)
            continue
        if group == "":
            values.append(0)
        elif group.isdigit() and group.isascii():
            values.append(int(group))
        else:
            return style  # not an SGR we understand: ignore it whole
    index = 0
    while index < len(values):
        code = values[index]
        if index in colon_groups:
            parts = colon_groups[index]
            head = parts[0]
            if head in ("38", "48"):
                colour = _sub_colour(parts)
                if colour is not None:
                    style = _coloured(style, head == "38", colour)
            elif head == "4":  # 4:0 no underline, 4:1–4:5 underline styles
                style = replace(style, underline=parts[1:] != ["0"])
            index += 1
            continue
        index += 1
        if code is None:
            continue
        if code == 0:
            style = PLAIN
        elif code in _SET_FLAG:
            style = replace(style, **{_SET_FLAG[code]: True})
        elif code in _CLEAR_FLAGS:
            style = replace(style, **dict.fromkeys(_CLEAR_FLAGS[code], False))
        elif 30 <= code <= 37:
            style = replace(style, fg=code - 30)
        elif 90 <= code <= 97:
            style = replace(style, fg=code - 90 + 8)
        elif 40 <= code <= 47:
            style = replace(style, bg=code - 40)
        elif 100 <= code <= 107:
            style = replace(style, bg=code - 100 + 8)
        elif code == 39:
            style = replace(style, fg=None)
        elif code == 49:
            style = replace(style, bg=None)
        elif code in (38, 48):
            colour, used = _extended(values[index:])
            index += used
            if colour is not None:
                style = _coloured(style, code == 38, colour)
    return style


def _open_tag(style: Style) -> str:
    classes = [f"ansi-{flag}" for flag in _FLAGS if getattr(style, flag)]
    attributes = ""
    if isinstance(style.fg, int):
        classes.append(f"ansi-fg-{style.fg}")
    if isinstance(style.bg, int):
        classes.append(f"ansi-bg-{style.bg}")
    if isinstance(style.fg, str):
        attributes += f' data-fg="{style.fg}"'
    if isinstance(style.bg, str):
        attributes += f' data-bg="{style.bg}"'
    class_attribute = f' class="{" ".join(classes)}"' if classes else ""
    return f"<span{class_attribute}{attributes}>"


def _sequence_end(text: str, start: int) -> tuple[int, str | None]:
    """Where the escape sequence at `start` ends, and its SGR parameters if it is an SGR."""
    length = len(text)
    if text[start] == CSI_C1 or text.startswith(ESC + "[", start):
        position = start + (1 if text[start] == CSI_C1 else 2)
        params_start = position
        while position < length and "\x30" <= text[position] <= "\x3f":
            position += 1
        params_end = position
        while position < length and "\x20" <= text[position] <= "\x2f":
            position += 1
        if position >= length or not "\x40" <= text[position] <= "\x7e":
            # Malformed or cut short: drop the introducer and what looked like parameters.
            return position, None
        if text[position] == "m" and params_end == position:
            return position + 1, text[params_start:params_end]
        return position + 1, None
    if text[start] == OSC_C1 or text.startswith(ESC + "]", start):
        position = start + (1 if text[start] == OSC_C1 else 2)
        while position < length:
            if text[position] == BEL:
                return position + 1, None
            if text.startswith(ESC + "\\", position):
                return position + 2, None
            position += 1
        return length, None  # an unterminated OSC hides the rest of the line, as a terminal would
    # ESC, intermediates, one final byte (charset selection `ESC ( B`, `ESC 7`, `ESC =`, …).
    position = start + 1
    while position < length and "\x20" <= text[position] <= "\x2f":
        position += 1
    if position < length and "\x30" <= text[position] <= "\x7e":
        position += 1
    return position, None


def _is_dropped_control(char: str) -> bool:
    code = ord(char)
    return (code < 0x20 and char != "\t") or code == 0x7F or 0x80 <= code <= 0x9F


def render_ansi(line: str) -> str:
    """One log line (no newline) as HTML: escaped text in spans for its SGR styles."""
    if line.endswith("\r"):
        line = line.rstrip("\r")
    pieces: list[tuple[Style, str]] = []
    style = PLAIN
    text: list[str] = []

    def flush() -> None:
        if not text:
            return
        if pieces and pieces[-1][0] == style:  # `red, reset, red` is one span
            pieces[-1] = (style, pieces[-1][1] + "".join(text))
        else:
            pieces.append((style, "".join(text)))
        text.clear()

    position = 0
    length = len(line)
    while position < length:
        char = line[position]
        if char in (ESC, CSI_C1, OSC_C1):
            end, params = _sequence_end(line, position)
            if params is not None:
                new_style = apply_sgr(style, params)
                if new_style != style:
                    flush()
                    style = new_style
            position = end
            continue
        if char == "\r":
            flush()
            pieces.clear()
        elif not _is_dropped_control(char):
            text.append(char)
        position += 1
    flush()
    html: list[str] = []
    for piece_style, piece_text in pieces:
        if piece_style == PLAIN:
            html.append(_escape(piece_text))
        else:
            html.append(f"{_open_tag(piece_style)}{_escape(piece_text)}</span>")
    return "".join(html)
