"""Importing one workflow file in isolation: what `conveyor compile` and a step process share.

Kept apart from the compiler so that a step process imports the SDK and this, not the lock's schema.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from conveyor.errors import ConveyorError
from conveyor.lockfile.errors import Diagnostic
from conveyor.sdk.declarations import Workflow
from conveyor.sdk.errors import AuthoringError

WORKFLOWS_PACKAGE = "conveyor_workflows"


class FileImportError(ConveyorError):
    """Collected diagnostics for one workflow file."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        super().__init__("; ".join(str(item) for item in diagnostics))
        self.diagnostics = diagnostics


class PathNames:
    """Turns absolute file names from code objects into repo-relative POSIX paths."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def relative(self, filename: str) -> str | None:
        try:
            return Path(filename).resolve().relative_to(self.root).as_posix()
        except (ValueError, OSError):
            return None


@dataclass
class ImportedFile:
    module: types.ModuleType
    imported_files: list[str]


# A module file's real path, by the `__file__` it was loaded from: the hundreds of modules already loaded
# are resolved once per process, not on every import of a workflow file.
_REAL_PATHS: dict[str, str] = {}


def _real_path(filename: str) -> str:
    real = _REAL_PATHS.get(filename)
    if real is None:
        real = _REAL_PATHS[filename] = os.path.realpath(filename)
    return real


def resolve_loaded_modules() -> None:
    """Resolve the files of the modules loaded so far (a step process does this before it is needed)."""
    for module in list(sys.modules.values()):
        if filename := getattr(module, "__file__", None):
            _real_path(filename)


def _modules_under(directory: Path) -> list[str]:
    prefix = str(directory.resolve())
    names = []
    for name, module in list(sys.modules.items()):
        filename = getattr(module, "__file__", None)
        if name == WORKFLOWS_PACKAGE or name.startswith(WORKFLOWS_PACKAGE + "."):
            names.append(name)
        elif filename and _real_path(filename).startswith(prefix):
            names.append(name)
    return names


@contextmanager
def _isolated_imports(conveyor_dir: Path) -> Iterator[None]:
    """Put `.conveyor/` first on sys.path and forget its modules before and after, so files never share state."""
    saved_path = list(sys.path)
    saved_dont_write_bytecode = sys.dont_write_bytecode
    # Compiling must not leave __pycache__ directories in the user's repository.
    sys.dont_write_bytecode = True
    sys.path.insert(0, str(conveyor_dir))
    for name in _modules_under(conveyor_dir):
        del sys.modules[name]
    importlib.invalidate_caches()
    try:
        yield
    finally:
        for name in _modules_under(conveyor_dir):
            sys.modules.pop(name, None)
        sys.path[:] = saved_path
        sys.dont_write_bytecode = saved_dont_write_bytecode


def _import_error(error: BaseException, names: PathNames, fallback: str) -> Diagnostic:
    if isinstance(error, SyntaxError) and error.filename:
        file = names.relative(error.filename) or fallback
        return Diagnostic(
            "error", "E100", file, error.lineno or 0, f"import failed: SyntaxError: {error.msg}"
        )
    file, line = fallback, 0
    for frame in traceback.extract_tb(error.__traceback__):
        relative = names.relative(frame.filename)
        if relative is not None:
            file, line = relative, frame.lineno or 0
    detail = f"{type(error).__name__}: {error}".strip()
    return Diagnostic("error", "E100", file, line, f"import failed: {detail}")


def _authoring_diagnostic(error: AuthoringError, names: PathNames, fallback: str) -> Diagnostic:
    file = (names.relative(error.file) if error.file else None) or fallback
    return Diagnostic("error", error.code, file, error.line or 0, error.message)


def import_workflow_file(root: Path, path: Path) -> ImportedFile:
    """Import one workflow file as `conveyor_workflows.<stem>` and record the `.conveyor/` files it imported."""
    conveyor_dir = (root / ".conveyor").resolve()
    names = PathNames(root)
    relative = names.relative(str(path)) or path.name
    module_name = f"{WORKFLOWS_PACKAGE}.{path.stem}"
    with _isolated_imports(conveyor_dir):
        package = types.ModuleType(WORKFLOWS_PACKAGE)
        package.__path__ = []
        sys.modules[WORKFLOWS_PACKAGE] = package
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except AuthoringError as error:
            raise FileImportError([_authoring_diagnostic(error, names, relative)]) from None
        except KeyboardInterrupt:
            raise
        except BaseException as error:
            raise FileImportError([_import_error(error, names, relative)]) from None
        imported = sorted(
            {
                rel
                for name in _modules_under(conveyor_dir)
                if (filename := getattr(sys.modules[name], "__file__", None))
                and (rel := names.relative(filename)) is not None
            }
            - {relative}
        )
    return ImportedFile(module, imported)


def module_workflows(module: types.ModuleType) -> list[tuple[str, Workflow]]:
    """A module's `Workflow` attributes (an object bound twice counts once, under its first name)."""
    seen: set[int] = set()
    found: list[tuple[str, Workflow]] = []
    for attribute, value in vars(module).items():
        if isinstance(value, Workflow) and id(value) not in seen:
            seen.add(id(value))
            found.append((attribute, value))
    return found
