"""Every design-note citation and relative Markdown link in the repository resolves.

The citation form is written down in `docs/design/README.md`: outside `docs/design/` a section is cited
as `docs/design/<note>.md §N[.M]` (more sections of the same note follow as `, §K` or a range `§N–§K`);
inside a note a bare section refers to that note and `<other>.md §N` to a sibling. A section exists when
the note has a Markdown heading numbered `N.` or `N.M`. Files are only read, never run or written.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DESIGN = ROOT / "docs" / "design"
SECTION_SIGN = "\u00a7"  # spelled as an escape so this file holds no citation of its own

_NUMBER = r"\d+(?:\.\d+)*"
_ONE = rf"{SECTION_SIGN}\s?{_NUMBER}(?:\s*[–-]\s*{SECTION_SIGN}?\s?{_NUMBER})?"
_CHAIN = rf"{_ONE}(?:\s*(?:,|and|or)\s*{_ONE})*"
# A note named by path or by bare name, optionally in backticks, optionally followed by its sections.
_CITATION = re.compile(
    rf"(?<![\w./-])(?P<path>(?:[\w.-]+/)*(?P<name>[A-Za-z_]+)\.md)`?(?:'s)?(?:\s*(?P<chain>{_CHAIN}))?"
)
_BARE_CHAIN = re.compile(_CHAIN)
_SECTION_NUMBERS = re.compile(rf"{SECTION_SIGN}?\s?({_NUMBER})")
_HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)[.\s]", re.MULTILINE)
_ANY_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
_MD_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Problem:
    """One reference that does not resolve: where it is and why."""

    file: str
    line: int
    text: str
    why: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.text!r}: {self.why}"


def sections_of(text: str) -> set[str]:
    """The section numbers a note's headings define (`## 5. Dispatch queue` -> `5`)."""
    return {m.group(1) for m in _HEADING.finditer(text)}


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\*|_(?=\w)|(?<=\w)_", lambda m: "_" if m.group(0) == "_" else "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).strip().lower()
    kept = []
    for char in text:
        if char in " -_" or unicodedata.category(char)[0] in "LN":
            kept.append("-" if char == " " else char)
    return "".join(kept)


def anchors_of(text: str) -> set[str]:
    """Every heading anchor of a Markdown document, with GitHub's `-1`, `-2` suffixes for repeats."""
    seen: dict[str, int] = {}
    anchors = set()
    for m in _ANY_HEADING.finditer(_FENCE.sub("", text)):
        base = slug(m.group(1))
        count = seen.get(base, 0)
        anchors.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return anchors


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _numbers(chain: str) -> list[str]:
    return _SECTION_NUMBERS.findall(chain)


def citation_problems(
    text: str, file: str, *, inside_design: bool, notes: dict[str, set[str]], own_note: str | None = None
) -> list[Problem]:
    """Problems with the design-note citations of one file's text (pure).

    `notes` maps a note's file name to its sections. A note is named by its path `docs/design/<note>.md`;
    inside `docs/design/` its bare name will do too. A bare section refers to `own_note` (None: an error).
    """
    problems: list[Problem] = []
    if ".md" not in text and SECTION_SIGN not in text:
        return problems
    lowered_notes = {name.lower(): name for name in notes}
    covered: list[tuple[int, int]] = []
    for m in _CITATION.finditer(text):
        path, name = m.group("path"), m.group("path").rsplit("/", 1)[-1]
        mentions_design = "design/" in path
        # `docs/execution.md` is the operator's page, not the note of the same name.
        note = lowered_notes.get(name.lower()) if mentions_design or "/" not in path else None
        where = _line_of(text, m.start())
        if note is None and (not mentions_design or path == "docs/design/README.md"):
            if m.group("chain"):
                covered.append(m.span())
                problems.append(
                    Problem(file, where, m.group(0), "only docs/design notes have numbered sections")
                )
            continue
        covered.append(m.span())
        if note is None or name != note:
            problems.append(Problem(file, where, m.group(0), "no such design note in docs/design/"))
            continue
        wanted = f"docs/design/{note}"
        if path != wanted and not (inside_design and path == note):
            problems.append(Problem(file, where, m.group(0), f"cite the note as {wanted}"))
            continue
        for number in _numbers(m.group("chain") or ""):
            if number not in notes[note]:
                problems.append(Problem(file, where, m.group(0), f"{note} has no section {number}"))
    for m in _BARE_CHAIN.finditer(text):
        if any(start <= m.start() < end for start, end in covered):
            continue
        where = _line_of(text, m.start())
        if own_note is None:
            problems.append(Problem(file, where, m.group(0), "a section without its note"))
            continue
        for number in _numbers(m.group(0)):
            if number not in notes[own_note]:
                problems.append(Problem(file, where, m.group(0), f"{own_note} has no section {number}"))
    return problems


def link_problems(text: str, file: Path, root: Path) -> list[Problem]:
    """Relative Markdown links of one document whose file or heading anchor does not exist."""
    problems = []
    body = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for m in _MD_LINK.finditer(body):
        target = m.group("target").strip("<>")
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # http:, https:, mailto:
        path_part, _, anchor = target.partition("#")
        resolved = (file.parent / path_part).resolve() if path_part else file
        shown = str(file.relative_to(root))
        where = _line_of(body, m.start())
        if not resolved.exists():
            problems.append(Problem(shown, where, target, "no such file"))
        elif anchor and resolved.suffix == ".md" and anchor not in anchors_of(resolved.read_text()):
            problems.append(Problem(shown, where, target, f"no heading #{anchor} in {resolved.name}"))
    return problems


_DOC_PATH = re.compile(r"(?<![\w/.-])(?P<path>(?:\.\./|docs/|bench/)[\w./-]*\.md)\b")


@functools.cache
def _document_names(root: Path) -> frozenset[str]:
    return frozenset(p.name for p in (root / "docs").rglob("*.md"))


def path_problems(text: str, file: Path, root: Path, *, data_allowed: bool) -> list[Problem]:
    """Paths to Markdown files (`docs/…`, `bench/…`, `../…`) that exist neither from the repository root
    nor from the file's folder. With `data_allowed` (tests and benchmarks hold made-up paths as data) only paths
    naming a document that exists somewhere under `docs/` are checked."""
    problems = []
    existing = _document_names(root)
    if file.suffix == ".md":  # a fenced block holds commands and their made-up file names
        text = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for m in _DOC_PATH.finditer(text):
        path = m.group("path")
        if data_allowed and path.rsplit("/", 1)[-1] not in existing:
            continue
        if not (root / path).exists() and not (file.parent / path).exists():
            shown = str(file.relative_to(root))
            problems.append(Problem(shown, _line_of(text, m.start()), path, "no such file"))
    return problems


def _scanned_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for folder, patterns in (
        ("src", ("*.py", "*.html", "*.js", "*.css")),
        ("tests", ("*.py",)),
        ("bench", ("*.py", "*.md")),
        ("docs", ("*.md",)),
    ):
        for pattern in patterns:
            files.extend(p for p in (ROOT / folder).rglob(pattern) if ".venv" not in p.parts)
    # This file holds made-up references as the checker's own test data.
    return sorted(set(files) - {Path(__file__).resolve()})


def _notes() -> dict[str, set[str]]:
    return {p.name: sections_of(p.read_text()) for p in DESIGN.glob("*.md") if p.name != "README.md"}


# --- the repository


def test_the_design_notes_are_in_the_repository() -> None:
    names = set(_notes())
    expected = {"ARCHITECTURE.md", "STYLE.md", "admin.md", "authoring.md", "cluster.md", "events.md"}
    assert expected | {"execution.md", "scaler.md"} <= names
    assert (DESIGN / "README.md").exists()


def test_every_design_citation_resolves() -> None:
    notes = _notes()
    problems = []
    for path in _scanned_files():
        inside = path.parent == DESIGN
        own = path.name if inside and path.name in notes else None
        problems += citation_problems(
            path.read_text(),
            str(path.relative_to(ROOT)),
            inside_design=inside,
            notes=notes,
            own_note=own,
        )
        problems += path_problems(
            path.read_text(),
            path,
            ROOT,
            data_allowed=path.suffix == ".py" and not path.is_relative_to(ROOT / "src"),
        )
    assert not problems, "unresolved design references:\n" + "\n".join(map(str, problems))


def test_every_relative_markdown_link_resolves() -> None:
    problems = []
    for path in _scanned_files():
        if path.suffix == ".md":
            problems += link_problems(path.read_text(), path, ROOT)
    assert not problems, "broken links:\n" + "\n".join(map(str, problems))


def test_the_readme_sends_readers_to_the_design_first() -> None:
    readme = (ROOT / "README.md").read_text()
    reading = readme.split("## Where to read next", 1)[1]
    first_item = next(line for line in reading.splitlines() if line.startswith("- "))
    assert "docs/design/" in first_item


# --- the checker itself (pure)

S = SECTION_SIGN
NOTES = {"execution.md": {"1", "5", "8", "8.4"}, "cluster.md": {"4", "4.5"}}


def _problems(text: str, *, inside: bool = False, own: str | None = None) -> list[str]:
    found = citation_problems(text, "f.py", inside_design=inside, notes=NOTES, own_note=own)
    return [p.why for p in found]


@pytest.mark.parametrize(
    "text",
    [
        f"(docs/design/execution.md {S}5)",
        f"`docs/design/execution.md` {S}8.4, {S}1",
        f"docs/design/execution.md {S}1–{S}5 and {S}8",
        f"docs/design/execution.md {S}1-5",
        "the whole of docs/design/cluster.md",
        "docs/execution.md and docs/design/cluster.md",
        "docs/design/README.md says how",
    ],
)
def test_resolving_citations_pass(text: str) -> None:
    assert _problems(text) == []


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (f"(execution.md {S}5)", "cite the note as docs/design/execution.md"),
        (f"../shared/design/execution.md {S}5", "cite the note as docs/design/execution.md"),
        (f"docs/design/execution.md {S}6", "execution.md has no section 6"),
        (f"docs/design/execution.md {S}8.1", "execution.md has no section 8.1"),
        (f"docs/design/execution.md {S}1–{S}6", "execution.md has no section 6"),
        (f"docs/design/Execution.md {S}5", "no such design note in docs/design/"),
        (f"docs/design/admin.md {S}3", "no such design note in docs/design/"),
        (f"as {S}5 says", "a section without its note"),
        (f"docs/execution.md {S}5", "only docs/design notes have numbered sections"),
        (f"docs/design/README.md {S}1", "only docs/design notes have numbered sections"),
        (f"docs/design/cluster.md {S}4; then {S}5", "a section without its note"),
    ],
)
def test_unresolved_citations_fail(text: str, why: str) -> None:
    assert why in _problems(text)


def test_inside_a_note_bare_sections_are_its_own_and_siblings_go_by_name() -> None:
    assert _problems(f"see {S}8.4 and `cluster.md` {S}4.5", inside=True, own="execution.md") == []
    assert _problems(f"see {S}4.5", inside=True, own="execution.md") == ["execution.md has no section 4.5"]
    assert _problems(f"`docs/design/cluster.md` {S}4", inside=True, own="execution.md") == []
    assert _problems(f"../design/cluster.md {S}4", inside=True, own="execution.md") == [
        "cite the note as docs/design/cluster.md"
    ]
    # docs/design/README.md: sibling names, but no note of its own for a bare section.
    assert _problems(f"`cluster.md` {S}4. See {S}4.5", inside=True) == ["a section without its note"]


def test_sections_come_from_numbered_headings() -> None:
    text = "# Title\n## 1. Sources\n### 2.1 Handshake\n**3.1 Bold.** is no heading\n## Acceptance\n"
    assert sections_of(text) == {"1", "2.1"}


def test_links_resolve_to_files_and_headings(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n## Running jobs on `workers`\n## Running jobs on workers\n")
    doc = tmp_path / "README.md"
    doc.write_text(
        "[ok](docs/a.md) [ok](docs/a.md#running-jobs-on-workers) [ok](docs/a.md#running-jobs-on-workers-1)"
        " [web](https://example.org/x.md) [bad](docs/b.md) [bad](docs/a.md#nowhere)\n"
        "```\n[not a link](docs/c.md)\n```\n"
    )
    found = [(p.text, p.why) for p in link_problems(doc.read_text(), doc, tmp_path)]
    assert found == [("docs/b.md", "no such file"), ("docs/a.md#nowhere", "no heading #nowhere in a.md")]
