"""Secret masking for log lines, step errors, step outputs and emitted payloads (docs/design/execution.md §7,
docs/design/authoring.md §2.5).

Pure: a `Masker` knows the secret values and replaces every value of at least 4 characters, each line of a
multi-line value, and their base64 and URL-encoded forms with `***`; `Masker.mask_json` does the same in
every string of a JSON value. `StreamMasker` does it over text that arrives in arbitrary pieces, so a value
split across reads or chunks is still caught.

In `model` because the agent program masks before a line leaves the runner and the orchestrator masks
again before it stores, and neither may import the other (docs/design/ARCHITECTURE.md §3).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, quote_plus

MASK = "***"
MIN_SECRET_LENGTH = 4
# A base64 fragment shorter than this (taken from the middle of a longer encoding) could occur by chance.
MIN_BASE64_FRAGMENT = 8


def _base64_forms(value: str) -> set[str]:
    """The encodings of `value` alone, plus the parts that stay the same wherever it sits in a longer blob.

    Base64 works on 3-byte groups, so a value preceded by 1 or 2 other bytes encodes differently; for each
    of the three alignments, the characters that depend only on the value's own bytes are a fixed string.
    """
    data = value.encode("utf-8", errors="surrogatepass")
    forms: set[str] = set()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        whole = encode(data).decode("ascii")
        forms.add(whole)
        forms.add(whole.rstrip("="))
        for shift in range(3):
            encoded = encode(b"\0" * shift + data).decode("ascii").rstrip("=")
            start = 4 if shift else 0  # the first group mixes foreign bytes with the value's
            total = shift + len(data)
            # Characters of a trailing partial group depend on the bytes that follow the value.
            stable_end = (total // 3) * 4
            fragment = encoded[start:stable_end]
            if len(fragment) >= MIN_BASE64_FRAGMENT:
                forms.add(fragment)
    return {form for form in forms if len(form) >= MIN_SECRET_LENGTH}


def _url_forms(value: str) -> set[str]:
    def encode(text: str, safe: str, plus: bool) -> str:
        quoting = quote_plus if plus else quote
        return quoting(text, safe=safe, errors="surrogatepass")

    forms = {
        encode(value, "", False),
        encode(value, "/", False),
        encode(value, "", True),
        encode(value, "/", True),
    }
    lowered = {re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), form) for form in forms}
    return forms | lowered


def secret_patterns(values: Iterable[str]) -> list[str]:
    """Every string to mask for these secret values, longest first; none contains a newline."""
    patterns: set[str] = set()
    for value in values:
        if len(value) < MIN_SECRET_LENGTH:
            continue
        lines = [line for line in re.split(r"\r\n|\r|\n", value) if len(line) >= MIN_SECRET_LENGTH]
        multi_line = "\n" in value or "\r" in value
        candidates: set[str] = set(lines) if multi_line else {value}
        for piece in {value, *lines}:
            candidates |= _base64_forms(piece) | _url_forms(piece)
        patterns.update(c for c in candidates if len(c) >= MIN_SECRET_LENGTH and not ("\n" in c or "\r" in c))
    return sorted(patterns, key=lambda p: (-len(p), p))


class Masker:
    """Replaces known secret values (and their encodings) in text with `***`."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self.patterns = secret_patterns(values)
        self.longest = len(self.patterns[0]) if self.patterns else 0
        self._regex = re.compile("|".join(re.escape(p) for p in self.patterns)) if self.patterns else None

    def __bool__(self) -> bool:
        return self._regex is not None

    def mask(self, text: str) -> str:
        """`text` with every occurrence replaced by `***`."""
        if self._regex is None or not text:
            return text
        return self._regex.sub(MASK, text)

    def mask_json(self, value: Any) -> Any:
        """A copy of a JSON value with every string masked: object keys and values, list items, nested.

        A number whose text holds a secret (a numeric secret returned as a number) becomes its masked text.
        Two keys that mask alike are both kept: the later ones get `#2`, `#3`… appended.
        """
        if self._regex is None:
            return value
        return self._mask_value(value)

    def _mask_value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.mask(value)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, dict):
            masked: dict[str, Any] = {}
            for key, item in value.items():
                masked[_free_key(masked, self.mask(str(key)))] = self._mask_value(item)
            return masked
        if isinstance(value, list | tuple):
            return [self._mask_value(item) for item in value]
        # Numbers, and anything else a JSON encoder would write as text.
        text = repr(value) if isinstance(value, int | float) else str(value)
        shown = self.mask(text)
        return value if shown == text else shown

    def finditer(self, text: str) -> Iterable[re.Match[str]]:
        """Non-overlapping matches, longest pattern first at each position."""
        if self._regex is None:
            return ()
        return self._regex.finditer(text)


def _free_key(taken: dict[str, Any], key: str) -> str:
    """`key`, or `key#N` for the smallest N >= 2 not in `taken` (masked keys can collide)."""
    if key not in taken:
        return key
    number = 2
    while f"{key}#{number}" in taken:
        number += 1
    return f"{key}#{number}"


class StreamMasker:
    """Masks text fed in arbitrary pieces: holds back only what could still be the start of a secret.

    No pattern contains a newline, so everything up to the last newline is always released; within a line,
    the last `longest - 1` characters wait for more input (or `flush`).
    """

    def __init__(self, masker: Masker) -> None:
        self.masker = masker
        self._pending = ""

    def feed(self, text: str) -> str:
        """Masked text that is safe to release now."""
        buffer = self._pending + text
        if not self.masker:
            self._pending = ""
            return buffer
        limit = max(len(buffer) - (self.masker.longest - 1), buffer.rfind("\n") + 1)
        released: list[str] = []
        position = 0
        for match in self.masker.finditer(buffer):
            if match.start() >= limit:
                break
            released.append(buffer[position : match.start()])
            released.append(MASK)
            position = match.end()
        cut = max(position, limit)
        released.append(buffer[position:cut])
        self._pending = buffer[cut:]
        return "".join(released)

    def flush(self) -> str:
        """Release (masked) whatever is held back, at the end of the stream."""
        rest, self._pending = self._pending, ""
        return self.masker.mask(rest)
