"""The mirror's pure choices: its key, what eviction deletes, which commit pins go."""

from __future__ import annotations

import pytest

from conveyor.agent.mirror import MirrorUsage, mirror_key, mirrors_to_evict, normalised_url, pins_to_drop


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("https://GitHub.com/acme/app.git", "https://github.com/acme/app"),
        ("https://github.com/acme/app/", "https://github.com/acme/app"),
        ("HTTPS://github.com/acme/app", "https://github.com/acme/app"),
    ],
)
def test_spellings_of_one_repository_share_a_mirror(first: str, second: str) -> None:
    assert normalised_url(first) == normalised_url(second)
    assert mirror_key(first) == mirror_key(second)


def test_different_repositories_and_paths_get_different_mirrors() -> None:
    keys = {
        mirror_key(url)
        for url in (
            "https://github.com/acme/app",
            "https://github.com/acme/App2",
            "https://gitlab.com/acme/app",
            "/srv/repos/app",
            "/srv/repos/other",
        )
    }
    assert len(keys) == 5
    assert all(len(key) == 32 and key.isalnum() for key in keys)


def test_a_path_keeps_its_case() -> None:
    assert normalised_url("/srv/Repos/App") != normalised_url("/srv/repos/app")


def usage(name: str, size: int, last_used: float) -> MirrorUsage:
    return MirrorUsage(name, size, last_used)


def test_nothing_is_evicted_within_the_bound() -> None:
    mirrors = [usage("a.git", 40, 1), usage("b.git", 60, 2)]
    assert mirrors_to_evict(mirrors, 100, keep=set()) == []


def test_the_least_recently_used_go_first_until_the_rest_fits() -> None:
    mirrors = [usage("new.git", 50, 30), usage("old.git", 50, 10), usage("mid.git", 50, 20)]
    assert mirrors_to_evict(mirrors, 100, keep=set()) == ["old.git"]
    assert mirrors_to_evict(mirrors, 50, keep=set()) == ["old.git", "mid.git"]
    assert mirrors_to_evict(mirrors, 0, keep=set()) == ["old.git", "mid.git", "new.git"]


def test_a_kept_mirror_is_never_evicted_even_when_it_alone_is_over_the_bound() -> None:
    mirrors = [usage("big.git", 500, 1), usage("other.git", 10, 2), usage("third.git", 10, 3)]
    assert mirrors_to_evict(mirrors, 100, keep={"big.git"}) == ["other.git", "third.git"]


def test_ties_in_last_use_break_by_name_so_the_choice_is_stable() -> None:
    mirrors = [usage("b.git", 10, 5), usage("a.git", 10, 5)]
    assert mirrors_to_evict(mirrors, 10, keep=set()) == ["a.git"]


def test_pins_beyond_the_newest_are_dropped() -> None:
    pins = [f"refs/conveyor/{n}" for n in range(60)]
    assert pins_to_drop(pins) == pins[50:]
    assert pins_to_drop(pins, keep=2) == pins[2:]
    assert pins_to_drop(pins[:3], keep=5) == []
