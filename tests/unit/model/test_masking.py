"""Secret masking: plain values, lines of multi-line values, base64 and URL-encoded forms, split input."""

from __future__ import annotations

import base64
import re
from urllib.parse import quote, quote_plus

from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.model.masking import MASK, Masker, StreamMasker

SECRET = "s3cr3t-Value/+=&x"


def test_plain_value_is_masked_everywhere_in_a_line() -> None:
    masker = Masker([SECRET])
    assert masker.mask(f"a {SECRET} b {SECRET}") == f"a {MASK} b {MASK}"


def test_values_shorter_than_four_characters_are_not_masked() -> None:
    masker = Masker(["abc"])
    assert masker.mask("abc abc") == "abc abc"


def test_each_line_of_a_multi_line_value_is_masked() -> None:
    masker = Masker(["first-line\nsecond-line\nok"])
    assert masker.mask("x first-line y") == f"x {MASK} y"
    assert masker.mask("second-line") == MASK
    assert masker.mask("ok") == "ok"


def test_base64_forms_are_masked() -> None:
    masker = Masker([SECRET])
    encoded = base64.b64encode(SECRET.encode()).decode()
    assert MASK in masker.mask(encoded)
    assert SECRET not in masker.mask(encoded) and encoded not in masker.mask(encoded)
    url_safe = base64.urlsafe_b64encode(SECRET.encode()).decode().rstrip("=")
    assert url_safe not in masker.mask(f"token={url_safe}")


def test_base64_of_a_value_inside_a_longer_blob_is_masked() -> None:
    masker = Masker([SECRET])
    for prefix in (b"", b"u", b"us", b"user:"):
        blob = base64.b64encode(prefix + SECRET.encode() + b"@host").decode()
        masked = masker.mask(blob)
        assert MASK in masked, prefix
        assert base64.b64encode(SECRET.encode()).decode()[4:12] not in masked.replace(MASK, "")


def test_url_encoded_forms_are_masked() -> None:
    masker = Masker([SECRET])
    lower_hex = re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), quote(SECRET, safe=""))
    for form in (quote(SECRET, safe=""), quote_plus(SECRET), lower_hex):
        assert masker.mask(f"?t={form}&y") == f"?t={MASK}&y", form


def test_stream_masker_catches_a_value_split_across_pieces() -> None:
    masker = Masker([SECRET])
    stream = StreamMasker(masker)
    text = f"before {SECRET} after\n"
    released = "".join(stream.feed(ch) for ch in text) + stream.flush()
    assert released == f"before {MASK} after\n"


def test_stream_masker_releases_complete_lines_at_once() -> None:
    stream = StreamMasker(Masker([SECRET]))
    assert stream.feed("hello\n") == "hello\n"


@settings(max_examples=200, deadline=None)
@given(
    secrets=st.lists(
        st.text(min_size=4, max_size=12).filter(lambda s: "\n" not in s and "\r" not in s),
        min_size=1,
        max_size=3,
    ),
    filler=st.lists(st.text(max_size=10), min_size=1, max_size=5),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8),
)
def test_stream_masking_equals_masking_the_whole_text(
    secrets: list[str], filler: list[str], cuts: list[int]
) -> None:
    masker = Masker(secrets)
    text = "".join(piece + secrets[i % len(secrets)] for i, piece in enumerate(filler))
    positions = sorted({min(cut, len(text)) for cut in cuts})
    pieces = [text[a:b] for a, b in zip([0, *positions], [*positions, len(text)], strict=True)]
    stream = StreamMasker(masker)
    released = "".join(stream.feed(piece) for piece in pieces) + stream.flush()
    assert released == masker.mask(text)
    for secret in secrets:
        assert secret not in released or secret in MASK


NO_STAR = st.characters(blacklist_characters="*\n\r", blacklist_categories=("Cs",))


@settings(max_examples=300, deadline=None)
@given(
    secret=st.text(NO_STAR, min_size=4, max_size=40),
    before=st.text(NO_STAR, max_size=20),
    after=st.text(NO_STAR, max_size=20),
)
def test_no_secret_survives_in_any_context(secret: str, before: str, after: str) -> None:
    masker = Masker([secret])
    assert secret not in masker.mask(before + secret + after)
    encoded = base64.b64encode(secret.encode()).decode()
    assert encoded not in masker.mask(before + encoded + after)
    assert quote(secret, safe="") not in masker.mask(before + quote(secret, safe="") + after)


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.text(NO_STAR, min_size=4, max_size=12), min_size=2, max_size=4))
def test_every_line_of_a_multi_line_secret_is_masked(lines: list[str]) -> None:
    masker = Masker(["\n".join(lines)])
    for line in lines:
        assert line not in masker.mask(f"<{line}>")


# --- JSON values (step outputs, emitted payloads)


def test_json_strings_are_masked_in_keys_values_and_nested_lists_and_objects() -> None:
    masker = Masker([SECRET])
    value = {
        "plain": f"a {SECRET} b",
        SECRET: "the key was the secret",
        f"x-{SECRET}": [1, f"{SECRET}", {"deep": [[f"<{SECRET}>"]]}],
        "untouched": ["one", 2, 3.5, True, None],
    }
    assert masker.mask_json(value) == {
        "plain": f"a {MASK} b",
        MASK: "the key was the secret",
        f"x-{MASK}": [1, MASK, {"deep": [[f"<{MASK}>"]]}],
        "untouched": ["one", 2, 3.5, True, None],
    }


def test_json_masking_leaves_its_argument_untouched() -> None:
    value = {"k": [SECRET], SECRET: {"n": SECRET}}
    before = repr(value)
    Masker([SECRET]).mask_json(value)
    assert repr(value) == before


def test_json_masking_catches_the_encodings_the_log_masker_catches() -> None:
    masker = Masker([SECRET])
    encoded = base64.b64encode(SECRET.encode()).decode()
    inside_blob = base64.b64encode(b"user:" + SECRET.encode()).decode()
    url_form = quote_plus(SECRET)
    masked = masker.mask_json({"b64": encoded, "auth": [inside_blob], url_form: {"u": f"?t={url_form}"}})
    text = repr(masked)
    assert encoded not in text and url_form not in text and SECRET not in text
    assert masked["b64"] == masker.mask(encoded) and MASK in masked["auth"][0]
    assert masked[MASK] == {"u": f"?t={MASK}"}


def test_each_line_of_a_multi_line_secret_is_masked_in_json_strings() -> None:
    masker = Masker(["first-line\nsecond-line"])
    assert masker.mask_json({"a": ["first-line", "x second-line y"]}) == {"a": [MASK, f"x {MASK} y"]}


def test_a_number_holding_a_numeric_secret_becomes_its_masked_text() -> None:
    masker = Masker(["424242"])
    assert masker.mask_json({"pin": 424242, "other": 17, "f": 1424242.5}) == {
        "pin": MASK,
        "other": 17,
        "f": f"1{MASK}.5",
    }


def test_keys_that_mask_alike_are_all_kept() -> None:
    masker = Masker(["alpha-secret", "beta-secret"])
    masked = masker.mask_json({"alpha-secret": 1, "beta-secret": 2, "***#2": 3})
    assert masked == {MASK: 1, f"{MASK}#2": 2, f"{MASK}#2#2": 3}


def test_json_masking_without_secrets_returns_the_value_itself() -> None:
    value = {"a": [1, "b"]}
    assert Masker([]).mask_json(value) is value


JSON_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(NO_STAR, max_size=12)
)


def _strings(value: object) -> list[str]:
    """Every string of a JSON value: keys, values, list items."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for key, item in value.items() for text in (key, *_strings(item))]
    if isinstance(value, list):
        return [text for item in value for text in _strings(item)]
    return []


@settings(max_examples=200, deadline=None)
@given(
    secret=st.text(NO_STAR, min_size=4, max_size=20),
    document=st.recursive(
        JSON_LEAVES,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(NO_STAR, max_size=8), inner, max_size=4)
        ),
        max_leaves=20,
    ),
    where=st.integers(min_value=0, max_value=3),
)
def test_no_secret_survives_in_any_string_of_a_json_value(secret: str, document: object, where: int) -> None:
    encoded = base64.b64encode(secret.encode()).decode()
    planted = [
        {"wrap": document, "s": f"<{secret}>"},
        [document, {secret: document}],
        {"k": [document, [secret]]},
        {"b64": encoded, "d": document},
    ][where]
    for text in _strings(Masker([secret]).mask_json(planted)):
        assert secret not in text and encoded not in text
