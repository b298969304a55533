"""Per-job requirements: a venv per `.conveyor/requirements.txt` hash (docs/design/execution.md §7, step 3).

The venv is built from the agent's own interpreter, in a temporary directory renamed into
`<venvs>/<sha256>/`, with a `.pth` file that adds the agent's site-packages, so `import conveyor` works in
steps even when the agent itself runs from a venv. Requirements win over the agent's packages: the agent's
directories are appended after the venv's own.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import site
import sys
from collections.abc import Callable
from pathlib import Path

import conveyor
from conveyor.errors import ConveyorError

Log = Callable[[str, str], None]
READY_MARKER = ".conveyor-ready"
# The interpreter the last job's steps ran with, when it was a requirements venv's: the next ready runner
# starts its spare step processes with it, so a repeat of a job with requirements starts no interpreter.
LAST_INTERPRETER_FILE = ".last-interpreter"


class RequirementsFailed(ConveyorError):
    """The venv could not be built; the job fails `requirements_failed`."""


def requirement_lines(text: str) -> list[str]:
    """The lines that ask pip for something (comments and blank lines dropped)."""
    lines = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def venv_key(text: str) -> str:
    """sha256 of the requirements and the interpreter that builds the venv."""
    digest = hashlib.sha256()
    digest.update(f"{sys.version}\n{sys.executable}\n".encode())
    digest.update(text.encode("utf-8"))
    return digest.hexdigest()


def remember_interpreter(venvs_dir: Path, python: str | None) -> None:
    """Record the venv interpreter a job's steps use (None: the runner's own) for the next ready runner."""
    hint = venvs_dir / LAST_INTERPRETER_FILE
    try:
        if python is None:
            hint.unlink(missing_ok=True)
            return
        venvs_dir.mkdir(parents=True, exist_ok=True)
        temporary = hint.with_name(f"{hint.name}.{os.getpid()}")
        temporary.write_text(python, encoding="utf-8")
        os.replace(temporary, hint)
    except OSError:
        pass  # only a hint: without it the next job's steps start their interpreters as they go


def remembered_interpreter(venvs_dir: Path) -> str | None:
    """The interpreter `remember_interpreter` recorded, if it is still that of a built venv in `venvs_dir`."""
    try:
        text = (venvs_dir / LAST_INTERPRETER_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    # Not `resolve()`: a venv's interpreter is a symlink to the base one, outside `venvs_dir`.
    python = Path(os.path.normpath(os.path.abspath(text)))
    venv = python.parent.parent
    if venv.parent != Path(os.path.abspath(venvs_dir)) or python != venv_python(venv):
        return None
    if not (venv / READY_MARKER).is_file() or not python.exists():
        return None
    return str(python)


def agent_site_directories() -> list[str]:
    """Where the agent's packages live: its site-packages and the directory holding `conveyor`."""
    directories = [*site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        directories.append(site.getusersitepackages())
    directories.append(str(Path(conveyor.__file__).resolve().parent.parent))
    seen: list[str] = []
    for directory in directories:
        if directory not in seen and Path(directory).is_dir():
            seen.append(directory)
    return seen


def venv_python(venv: Path) -> Path:
    """The venv's interpreter."""
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _site_packages(venv: Path) -> Path:
    if os.name == "nt":
        return venv / "Lib" / "site-packages"
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def pth_text(directories: list[str]) -> str:
    """A `.pth` whose lines run `site.addsitedir`, so `.pth` files there (editable installs) apply too."""
    return "".join(f"import site; site.addsitedir({directory!r})\n" for directory in directories)


async def _run(args: list[str], log: Log) -> int:
    log("$ " + " ".join(args), "sys")
    process = await asyncio.create_subprocess_exec(
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert process.stdout is not None
    async for raw in process.stdout:
        log(raw.decode("utf-8", errors="replace").rstrip("\n"), "out")
    return await process.wait()


def _fix_shebangs(bin_dir: Path, old: str, new: str) -> None:
    # pip writes absolute shebangs; the venv moved from its temporary name.
    for path in bin_dir.iterdir():
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if data.startswith(b"#!") and old.encode() in data.split(b"\n", 1)[0]:
            first, _, rest = data.partition(b"\n")
            path.write_bytes(first.replace(old.encode(), new.encode()) + b"\n" + rest)


def _prepare(requirements: Path, venvs_dir: Path) -> tuple[Path, bool]:
    target = venvs_dir / venv_key(requirements.read_text(encoding="utf-8"))
    venvs_dir.mkdir(parents=True, exist_ok=True)
    return target, (target / READY_MARKER).exists()


async def ensure_venv(requirements: Path, venvs_dir: Path, log: Log) -> Path:
    """The venv for these requirements (built once per hash); returns its directory."""
    target, ready = _prepare(requirements, venvs_dir)
    if ready:
        log(f"using the requirements venv {target.name[:12]}", "sys")
        return target
    temporary = venvs_dir / f".tmp-{target.name[:12]}-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        if await _run([sys.executable, "-m", "venv", "--without-pip", str(temporary)], log) != 0:
            raise RequirementsFailed("creating the venv failed")
        packages = _site_packages(temporary)
        packages.mkdir(parents=True, exist_ok=True)
        (packages / "_conveyor_agent.pth").write_text(pth_text(agent_site_directories()), encoding="utf-8")
        pip = [sys.executable, "-m", "pip", "--python", str(venv_python(temporary)), "install"]
        if await _run([*pip, "--disable-pip-version-check", "-r", str(requirements)], log) != 0:
            raise RequirementsFailed("pip install -r .conveyor/requirements.txt failed")
        _fix_shebangs(temporary / ("Scripts" if os.name == "nt" else "bin"), str(temporary), str(target))
        (temporary / READY_MARKER).write_text("ok\n")
        try:
            temporary.rename(target)
        except OSError:
            # Another job built the same venv first; use it.
            shutil.rmtree(temporary, ignore_errors=True)
        return target
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
