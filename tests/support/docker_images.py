"""The test suite's container images, built offline and loaded into the test engine.

No registry is reachable from the machines the suite runs on, so the images are made from Debian
packages: `busybox` is the static binary of Debian's `busybox-static` with a link per applet, and
`debian` is a `debootstrap --variant=minbase` bookworm with Python and git (the agent container tests run
Conveyor on its Python). Each is written as a `docker save`-format archive (one layer, a config, a
manifest: the format `POST /images/load` reads, Docker's and Podman's alike) into a cache directory
outside the checkout, named by the recipe that built it (the package versions and this module's recipe
text), so a later run loads it in a second instead of paying the minute of `debootstrap`.

`python -m tests.support.docker_images ensure --host unix://…` builds what the cache lacks and loads
what the engine lacks; `scripts/ensure-docker.sh` runs it. Tests name the images by `IMAGES`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiodocker

RECIPE_LABEL = "conveyor.test-recipe"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEBIAN_SUITE = "bookworm"
# `python3` (not only python3-minimal): the agent needs asyncio, json and ssl from the full standard library.
DEBIAN_PACKAGES = ("python3", "git", "ca-certificates")
DEBIAN_MIRROR = os.environ.get("CONVEYOR_TEST_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# Trimmed from the Debian tree: package caches and documentation nothing in a test reads (~170 MB).
DEBIAN_TRIM = (
    "var/cache/apt/archives",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/locale",
    "usr/share/info",
)
RECIPE_VERSION = "1"  # bump when the way an image is made changes


@dataclass(frozen=True)
class TestImage:
    """One image of the suite: its reference in the engine and how its archive is made."""

    name: str
    reference: str
    recipe: Callable[[], str]
    build: Callable[[Path, str], None]  # (archive path, recipe key) -> writes the archive


def cache_dir() -> Path:
    """Where built archives are kept between runs (outside any checkout)."""
    configured = os.environ.get("CONVEYOR_TEST_IMAGE_CACHE")
    if configured:
        return Path(configured)
    if os.geteuid() == 0:
        return Path("/var/cache/conveyor-test-images")
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "conveyor-test-images"


def _package_version(package: str) -> str:
    done = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True, check=False
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise SystemExit(
            f"the test images are built from Debian's {package} package, which is not installed "
            f"(apt-get install {package}; scripts/ensure-docker.sh does it when run as root)"
        )
    return done.stdout.strip()


def recipe_key(text: str) -> str:
    """A short digest naming a recipe (pure)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- the archive format ----------------------------------------------------------------------------------


def image_config(name: str, key: str, diff_id: str, *, cmd: list[str], env: list[str]) -> dict[str, object]:
    """The image configuration of a one-layer image (OCI/Docker image config, pure)."""
    return {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Env": env, "Cmd": cmd, "Labels": {RECIPE_LABEL: key, "conveyor.test-image": name}},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": f"conveyor test image {name}"}],
    }


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_archive(
    archive: Path, layer: Path, *, name: str, reference: str, key: str, cmd: list[str], env: list[str]
) -> None:
    """Wrap a root filesystem tar (`layer`) as a `docker save` archive tagged `reference`."""
    diff_id = "sha256:" + _sha256_of(layer)
    config = json.dumps(image_config(name, key, diff_id, cmd=cmd, env=env), sort_keys=True).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [reference], "Layers": [layer_name]}]).encode()
    with tarfile.open(archive, "w") as out:
        for member_name, data in ((config_name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(member_name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
        out.add(layer, arcname=layer_name)


# --- busybox ---------------------------------------------------------------------------------------------


def busybox_recipe() -> str:
    return f"busybox recipe {RECIPE_VERSION}; busybox-static {_package_version('busybox-static')}"


def _busybox_binary() -> Path:
    listed = subprocess.run(["dpkg", "-L", "busybox-static"], capture_output=True, text=True, check=True)
    for line in listed.stdout.splitlines():
        if line.endswith("/busybox") and Path(line).is_file():
            return Path(line)
    raise SystemExit("busybox-static is installed but its busybox binary was not found")


def build_busybox(archive: Path, key: str) -> None:
    """/bin/busybox, a symbolic link per applet at the path busybox lists, /tmp, /root, /etc/passwd."""
    binary = _busybox_binary()
    applets = subprocess.run([str(binary), "--list-full"], capture_output=True, text=True, check=True)
    with tempfile.TemporaryDirectory(dir=archive.parent) as work:
        layer = Path(work) / "layer.tar"
        with tarfile.open(layer, "w") as tar:
            directories = {"bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc", "tmp", "root", "var", "www"}
            for directory in sorted(directories):
                info = tarfile.TarInfo(directory)
                info.type = tarfile.DIRTYPE
                info.mode = 0o1777 if directory == "tmp" else 0o755
                tar.addfile(info)
            info = tar.gettarinfo(str(binary), arcname="bin/busybox")
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            with binary.open("rb") as handle:
                tar.addfile(info, handle)
            for applet in sorted(set(applets.stdout.split())):
                if applet == "bin/busybox":
                    continue
                link = tarfile.TarInfo(applet)
                link.type = tarfile.SYMTYPE
                link.linkname = "/bin/busybox"
                tar.addfile(link)
            for path, text in (
                ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"),
                ("etc/group", "root:x:0:\nnogroup:x:65534:\n"),
            ):
                data = text.encode()
                file_info = tarfile.TarInfo(path)
                file_info.size = len(data)
                file_info.mode = 0o644
                tar.addfile(file_info, io.BytesIO(data))
        write_archive(
            archive,
            layer,
            name="busybox",
            reference=IMAGES["busybox"],
            key=key,
            cmd=["sh"],
            env=[f"PATH={DEFAULT_PATH}"],
        )


# --- Debian with Python and git --------------------------------------------------------------------------


def debian_recipe() -> str:
    return (
        f"debian recipe {RECIPE_VERSION}; debootstrap {_package_version('debootstrap')} --variant=minbase "
        f"--include={','.join(DEBIAN_PACKAGES)} {DEBIAN_SUITE}; trimmed {' '.join(DEBIAN_TRIM)}"
    )


def build_debian(archive: Path, key: str) -> None:
    """`debootstrap --variant=minbase` with Python and git, trimmed, as one layer (needs root)."""
    if os.geteuid() != 0:
        raise SystemExit(
            "building the Debian test image runs debootstrap, which needs root "
            f"(or put a built archive in {cache_dir()}; see docs/operations.md)"
        )
    with tempfile.TemporaryDirectory(dir=archive.parent) as work:
        root = Path(work) / "root"
        print(
            f"== debootstrap {DEBIAN_SUITE} from {DEBIAN_MIRROR} (a few minutes, once per recipe)", flush=True
        )
        started = time.monotonic()
        done = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(DEBIAN_PACKAGES)}",
                DEBIAN_SUITE,
                str(root),
                DEBIAN_MIRROR,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(
                f"debootstrap failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}"
            )
        for relative in DEBIAN_TRIM:
            target = root / relative
            if target.is_dir():
                for child in target.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
        layer = Path(work) / "layer.tar"
        subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(layer), "."], check=True)
        print(f"== debootstrap done in {time.monotonic() - started:.0f} s", flush=True)
        write_archive(
            archive,
            layer,
            name="debian",
            reference=IMAGES["debian"],
            key=key,
            cmd=["bash"],
            env=[f"PATH={DEFAULT_PATH}", "LANG=C.UTF-8"],
        )


IMAGES = {"busybox": "conveyor-test/busybox:test", "debian": "conveyor-test/debian:test"}
RECIPES: dict[str, tuple[Callable[[], str], Callable[[Path, str], None]]] = {
    "busybox": (busybox_recipe, build_busybox),
    "debian": (debian_recipe, build_debian),
}


# --- cache and engine ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock file: two runs building one archive at once build it once."""
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def cached_archive(name: str) -> tuple[Path, str]:
    """The archive of image `name` in the cache (built now if missing) and its recipe key."""
    recipe, build = RECIPES[name]
    key = recipe_key(recipe())
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    archive = directory / f"{name}-{key}.tar"
    with _locked(directory / f".{name}.lock"):
        if not archive.exists():
            partial = directory / f".{name}-{key}.tar.partial"
            build(partial, key)
            partial.rename(archive)
    return archive, key


async def loaded_key(docker: aiodocker.Docker, reference: str) -> str | None:
    """The recipe key of the image the engine has under `reference` (None: it has none)."""
    try:
        inspected = await docker.images.inspect(reference)
    except aiodocker.DockerError as exc:
        if exc.status == 404:
            return None
        raise
    labels = (inspected.get("Config") or {}).get("Labels") or {}
    return labels.get(RECIPE_LABEL)


async def ensure(host: str, names: list[str]) -> None:
    """Build what the cache lacks and load into the engine at `host` what it lacks (or has from another recipe)."""
    async with aiodocker.Docker(url=host) as docker:
        for name in names:
            archive, key = await asyncio.to_thread(cached_archive, name)
            if await loaded_key(docker, IMAGES[name]) == key:
                continue
            started = time.monotonic()
            with archive.open("rb") as handle:
                await docker.images.import_image(handle)
            if await loaded_key(docker, IMAGES[name]) != key:
                raise SystemExit(f"loading {archive} did not give {IMAGES[name]} with recipe {key}")
            print(
                f"== loaded {IMAGES[name]} ({archive.stat().st_size >> 20} MB) in {time.monotonic() - started:.1f} s"
            )


async def ping(host: str) -> None:
    """Raise unless an engine answers at `host`."""
    async with aiodocker.Docker(url=host) as docker:
        await docker.version()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "command", choices=["ensure", "ping"], help="ensure: build and load; ping: engine answers"
    )
    parser.add_argument("--host", default=os.environ.get("CONVEYOR_TEST_DOCKER_HOST"), help="engine address")
    parser.add_argument("--only", default=",".join(IMAGES), help="comma-separated images (default all)")
    args = parser.parse_args()
    if not args.host:
        raise SystemExit("no engine: pass --host unix://… or set CONVEYOR_TEST_DOCKER_HOST")
    if args.command == "ping":
        asyncio.run(ping(args.host))
        return
    names = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(names) - set(IMAGES))
    if unknown:
        raise SystemExit(f"unknown test images: {', '.join(unknown)} (known: {', '.join(IMAGES)})")
    asyncio.run(ensure(args.host, names))


if __name__ == "__main__":
    sys.exit(main())
