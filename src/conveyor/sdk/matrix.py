"""A job's matrix: its combinations, keys and display names (docs/design/authoring.md §2.1)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence

from conveyor.sdk.errors import authoring_error

MATRIX_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
MAX_MATRIX_COMBINATIONS = 256
MatrixValue = str | int | float | bool
MatrixLike = Mapping[str, Sequence[MatrixValue]] | Sequence[MatrixValue]


def expand_matrix(
    matrix: MatrixLike | None,
    include: Iterable[Mapping[str, MatrixValue]] = (),
    exclude: Iterable[Mapping[str, MatrixValue]] = (),
    *,
    location: tuple[str, int] | None = None,
) -> tuple[tuple[str, ...], list[dict[str, MatrixValue]]] | None:
    """Expand a matrix: Cartesian product (first key slowest), then `exclude`, then `include` (E109 on errors)."""
    include, exclude = list(include), list(exclude)
    if matrix is None:
        if include or exclude:
            raise authoring_error("E109", "include/exclude need a matrix", location)
        return None
    if isinstance(matrix, Mapping):
        dimensions = {key: list(values) for key, values in matrix.items()}
    elif isinstance(matrix, Sequence) and not isinstance(matrix, str):
        dimensions = {"value": list(matrix)}
    else:
        raise authoring_error("E109", "matrix must be a dict of lists or a list", location)
    keys = tuple(dimensions)
    for key, values in dimensions.items():
        if not isinstance(key, str) or not MATRIX_KEY_RE.match(key):
            raise authoring_error("E109", f"matrix key {key!r} is not a valid identifier", location)
        for value in values:
            if not isinstance(value, str | int | float | bool):
                raise authoring_error(
                    "E109", f"matrix value {value!r} of {key!r} is not str/int/float/bool", location
                )
    total = 1
    for values in dimensions.values():
        total *= len(values)
    # Refuse before materialising: a typo can make the product astronomically large.
    if total > MAX_MATRIX_COMBINATIONS * 64:
        raise authoring_error(
            "E109", f"matrix has {total} combinations (at most {MAX_MATRIX_COMBINATIONS} allowed)", location
        )
    combinations = [
        dict(zip(keys, values, strict=True)) for values in itertools.product(*dimensions.values())
    ]
    for entry in exclude:
        if not isinstance(entry, Mapping) or not entry or not set(entry) <= set(keys):
            raise authoring_error(
                "E109", f"exclude entry {entry!r} must use only the matrix keys {list(keys)}", location
            )
        combinations = [c for c in combinations if any(_differs(c[k], v) for k, v in entry.items())]
    for entry in include:
        if not isinstance(entry, Mapping) or set(entry) != set(keys):
            raise authoring_error(
                "E109", f"include entry {entry!r} must have exactly the keys {list(keys)}", location
            )
        for value in entry.values():
            if not isinstance(value, str | int | float | bool):
                raise authoring_error("E109", f"include value {value!r} is not str/int/float/bool", location)
        combination = {key: entry[key] for key in keys}
        if not any(_same_combination(combination, existing) for existing in combinations):
            combinations.append(combination)
    if not 1 <= len(combinations) <= MAX_MATRIX_COMBINATIONS:
        raise authoring_error(
            "E109",
            f"matrix has {len(combinations)} combinations (must be 1 to {MAX_MATRIX_COMBINATIONS})",
            location,
        )
    return keys, combinations


def _differs(left: MatrixValue, right: MatrixValue) -> bool:
    # `True == 1` in Python; matrix values are compared as JSON would, so types must agree too.
    return type(left) is not type(right) or left != right


def _same_combination(left: Mapping[str, MatrixValue], right: Mapping[str, MatrixValue]) -> bool:
    return not any(_differs(left[key], right[key]) for key in left)


def matrix_key(combination: Mapping[str, MatrixValue]) -> str:
    """The combination's key, e.g. `py=3.11,os=linux`."""
    return ",".join(f"{key}={_display(value)}" for key, value in combination.items())


def matrix_display(job_name: str, combination: Mapping[str, MatrixValue]) -> str:
    """The combination's display name, e.g. `test (3.11, linux)`."""
    return f"{job_name} ({', '.join(_display(value) for value in combination.values())})"


def _display(value: MatrixValue) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)
