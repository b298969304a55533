"""Every knob of `conveyor.model.knobs` has a behaviour test (the table in the knob test module).

A knob that is stored, validated and documented but read by nothing is a setting an operator sets
for nothing; this test fails for any knob without a named behaviour test, except the explicit
list of knobs the cluster issues still have to wire.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conveyor.model.knobs import ALL_KNOBS, CLUSTER_KNOBS_BY_NAME, ORG_KNOBS_BY_NAME
from tests.integration.knobs.test_knobs import AWAITING_CLUSTER_ISSUES, KNOB_TESTS

ROOT = Path(__file__).resolve().parents[3]
KNOB_NAMES = {knob.name for knob in ALL_KNOBS}


def test_every_knob_has_a_behaviour_test_or_is_explicitly_awaiting_the_cluster_issues() -> None:
    missing = sorted(KNOB_NAMES - set(KNOB_TESTS) - AWAITING_CLUSTER_ISSUES)
    assert not missing, f"knobs without a behaviour test: {missing}"


def test_the_tables_name_only_real_knobs_and_the_allowlist_only_what_is_still_untested() -> None:
    assert set(KNOB_TESTS) <= KNOB_NAMES, sorted(set(KNOB_TESTS) - KNOB_NAMES)
    assert AWAITING_CLUSTER_ISSUES <= KNOB_NAMES, sorted(AWAITING_CLUSTER_ISSUES - KNOB_NAMES)
    # A knob that gained its test leaves the allowlist.
    assert not (AWAITING_CLUSTER_ISSUES & set(KNOB_TESTS)), sorted(AWAITING_CLUSTER_ISSUES & set(KNOB_TESTS))
    # Only the reroute knobs and the scaler backstop may wait for the cluster issues.
    for name in AWAITING_CLUSTER_ISSUES:
        assert name.startswith("reroute_") or name == "scaler_reap_stranded_timeout_ms", name
    assert set(CLUSTER_KNOBS_BY_NAME) | set(ORG_KNOBS_BY_NAME) == KNOB_NAMES


def _test_functions(path: Path) -> dict[str, str]:
    source = path.read_text(encoding="utf-8")
    return {
        node.name: ast.get_source_segment(source, node) or ""
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
    }


def _support_modules(source: str) -> list[Path]:
    """The `tests/support` modules a test module imports from."""
    return [
        ROOT / (node.module.replace(".", "/") + ".py")
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests.support.")
    ]


def test_each_named_test_exists_and_sets_its_knob() -> None:
    problems = []
    for knob, node_id in sorted(KNOB_TESTS.items()):
        file, _, name = node_id.partition("::")
        path = ROOT / file
        if not path.is_file() or name not in _test_functions(path):
            problems.append(f"{knob}: {node_id} does not exist")
            continue
        # The knob is set by the test, its module, the fixtures next to it, or a `tests.support` helper the
        # module imports (an env default, e.g. the dispatch stage's).
        spelled = (knob, f"CONVEYOR_{knob.upper()}")
        texts = [path.read_text(encoding="utf-8")]
        texts += [
            p.read_text(encoding="utf-8")
            for p in (path.parent / "conftest.py", *_support_modules(texts[0]))
            if p.is_file()
        ]
        if not any(word in text for text in texts for word in spelled):
            problems.append(f"{knob}: {node_id} never sets it")
    assert not problems, problems
