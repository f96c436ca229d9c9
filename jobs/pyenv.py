"""The Python environment the job's executors run: packed once from the driver's own
environment, cached, and shipped to a cluster as a Spark archive.

The executors replay the pipelines (``jobs/tasks.py``): they import the engine's batch
functions, the streams API, pyarrow, and every pipeline module with whatever it imports.
The archive holds exactly the installed distributions those imports load, found by
importing them in a fresh interpreter (the driver's own has pyspark and more loaded),
with their requirements. Spark adds its own Python (``pyspark.zip``, py4j) to every
worker's path and the job ships the project's modules and the pipeline modules with
``addPyFile`` (``jobs/session.py``), so the archive holds nothing of the project's own
and nothing of pyspark (its jars are most of the driver's virtualenv).

The archive is a virtualenv without an interpreter: ``bin/python`` is a link to the base
interpreter of the driver's environment, so every node needs that Python at that path.
Where the nodes have another, give the job one they have instead: ``--python-env``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path, PurePosixPath

#: The modules the executors import besides the pipeline modules.
EXECUTOR_MODULES = ("pyarrow", "jobs.tasks")
#: Distributions never packed: the cluster has Spark, the job ships the project.
NOT_PACKED = frozenset(("pyspark", "py4j", "streamstate"))
#: Where an archive unpacks in an executor's working directory (``#name`` of spark.archives).
ARCHIVE_LINK = "streamstate-env"
#: The executors' interpreter inside the unpacked archive.
ARCHIVE_PYTHON = f"./{ARCHIVE_LINK}/bin/python"
#: Bumped whenever the archive's layout changes, so that a cached one is rebuilt.
LAYOUT = "1"

_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class PackError(RuntimeError):
    """The environment could not be packed."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(dist: metadata.Distribution) -> Iterator[str]:
    """The distributions ``dist`` requires outside its extras. A requirement under another
    marker (a Python version, a platform) counts when it is installed: pip evaluated the
    marker when it installed the environment."""
    for requirement in dist.requires or []:
        spec, _, marker = requirement.partition(";")
        if "extra" in marker:
            continue
        found = _NAME.match(spec)
        if found:
            yield found.group(1)


def _installed(name: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


def closure(roots: Iterable[str]) -> list[metadata.Distribution]:
    """The installed distributions ``roots`` name and everything they require, by name."""
    seen: dict[str, metadata.Distribution] = {}
    pending = list(roots)
    while pending:
        name = pending.pop()
        key = canonical(name)
        if key in seen:
            continue
        dist = _installed(name)
        if dist is None:
            if name in roots:
                raise PackError(f"{name} is not installed in {sys.prefix}")
            continue  # a requirement whose marker excluded it here
        seen[key] = dist
        pending.extend(_requirement_names(dist))
    return sorted(seen.values(), key=lambda d: canonical(d.metadata["Name"]))


_IMPORTED = (
    "import importlib, json, sys\n"
    "for name in sys.argv[1:]:\n"
    "    importlib.import_module(name)\n"
    "print(json.dumps(sorted({name.split('.')[0] for name in sys.modules})))\n"
)


def imported_by(modules: Iterable[str]) -> list[str]:
    """The top-level modules a fresh interpreter of this environment loads when it
    imports ``modules``."""
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTED, *modules],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise PackError(f"the executors' modules cannot be imported here: {last}")
    found: list[str] = json.loads(done.stdout)
    return found


def executor_distributions(modules: Iterable[str] = ()) -> list[str]:
    """The installed distributions whose modules the executors import (the job's and
    ``modules``, the pipeline modules)."""
    providers = metadata.packages_distributions()
    names = {
        dist
        for top in imported_by([*EXECUTOR_MODULES, *modules])
        for dist in providers.get(top, [])
    }
    return sorted(name for name in names if canonical(name) not in NOT_PACKED)


def base_python() -> Path:
    """The interpreter the driver's virtualenv was made from (itself outside of one)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return Path(base).resolve()


def _site_packages(root: Path) -> Path:
    major, minor = sys.version_info[:2]
    return root / "lib" / f"python{major}.{minor}" / "site-packages"


@dataclass(frozen=True)
class PackedFile:
    source: Path
    name: str  # relative to the archive's site-packages


def dist_files(dist: metadata.Distribution) -> Iterator[PackedFile]:
    """The files a distribution installed into site-packages (its RECORD)."""
    base = Path(str(dist.locate_file(""))).resolve()
    for entry in dist.files or []:
        relative = PurePosixPath(str(entry))
        if relative.parts and relative.parts[0] == "..":
            continue  # scripts in bin/: the executors run none
        if "__pycache__" in relative.parts:
            continue  # compiled again on first import
        source = base / relative
        if source.is_file():
            yield PackedFile(source, relative.as_posix())


def fingerprint(dists: list[metadata.Distribution]) -> str:
    """Names the archive: the layout, the interpreter and each distribution's version."""
    digest = hashlib.sha256(f"{LAYOUT}\n{sys.version}\n{base_python()}\n".encode())
    for dist in dists:
        digest.update(f"{canonical(dist.metadata['Name'])}=={dist.version}\n".encode())
    return digest.hexdigest()[:12]


def archive_name(dists: list[metadata.Distribution]) -> str:
    major, minor = sys.version_info[:2]
    return f"streamstate-executor-env-py{major}{minor}-{fingerprint(dists)}.tar.gz"


def _pyvenv_cfg() -> bytes:
    python = base_python()
    version = ".".join(str(part) for part in sys.version_info[:3])
    return (
        f"home = {python.parent}\ninclude-system-site-packages = false\n"
        f"version = {version}\nexecutable = {python}\n"
    ).encode()


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = int(time.time())
    archive.addfile(info, io.BytesIO(data))


def _add_link(archive: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    info.mode = 0o777
    info.mtime = int(time.time())
    archive.addfile(info)


def write_archive(target: Path, dists: list[metadata.Distribution]) -> Path:
    """Pack ``dists`` as a virtualenv into ``target`` (.tar.gz), atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    site = _site_packages(Path(".")).as_posix()
    fd, partial_name = tempfile.mkstemp(prefix=target.name, suffix=".tmp", dir=target.parent)
    os.close(fd)
    partial = Path(partial_name)
    try:
        # Level 1: the archive is packed once but unpacked by every executor of every run;
        # most of it is compiled code, which compresses little at any level.
        with tarfile.open(partial, "w:gz", compresslevel=1) as archive:
            _add_bytes(archive, "pyvenv.cfg", _pyvenv_cfg())
            _add_link(archive, "bin/python", str(base_python()))
            _add_link(archive, "bin/python3", "python")
            for dist in dists:
                for packed in dist_files(dist):
                    archive.add(packed.source, f"{site}/{packed.name}", recursive=False)
        partial.chmod(0o644)
        partial.replace(target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return target


def cache_dir() -> Path:
    """``STREAMSTATE_CACHE_DIR``, else the project's ``.cache/`` when it can be written
    (a checkout), else ``~/.cache/streamstate`` (an installed package)."""
    chosen = os.environ.get("STREAMSTATE_CACHE_DIR")
    if chosen:
        return Path(chosen)
    project = Path(__file__).resolve().parents[1] / ".cache"
    if os.access(project if project.exists() else project.parent, os.W_OK):
        return project
    return Path.home() / ".cache" / "streamstate"


def executor_archive(cache: Path | None = None, modules: Iterable[str] = ()) -> Path:
    """The packed executor environment (for the pipeline ``modules``), packed now unless
    this version is cached."""
    dists = closure(executor_distributions(modules))
    target = (cache or cache_dir()) / "executor-env" / archive_name(dists)
    if target.exists():
        return target
    print(f"recompute: packing the executors' Python environment into {target}", file=sys.stderr)
    return write_archive(target, dists)


#: Where the executors' interpreter comes from (recorded in the Spark conf as SOURCE_KEY).
SOURCE_KEY = "spark.streamstate.executorPython.source"
SOURCE_ARCHIVE = "packed archive"
SOURCE_OPTION = "--python-env"
SOURCE_ENV = "PYSPARK_PYTHON"
SOURCE_DRIVER = "driver"


@dataclass(frozen=True)
class ExecutorPython:
    """The interpreter the executors run the UDFs with, and the archive that brings it."""

    python: str
    source: str
    archive: Path | None = None


def choose_python(
    local: bool, python_env: str | None, environ: Mapping[str, str], modules: Iterable[str] = ()
) -> ExecutorPython:
    """``--python-env`` first, then ``PYSPARK_PYTHON`` (spark-submit's
    ``spark.pyspark.python`` arrives as it); otherwise a local master runs the driver's
    own interpreter and a cluster the packed environment (for the pipeline ``modules``)."""
    if python_env:
        return ExecutorPython(python_env, SOURCE_OPTION)
    if environ.get("PYSPARK_PYTHON"):
        return ExecutorPython(environ["PYSPARK_PYTHON"], SOURCE_ENV)
    if local:
        return ExecutorPython(sys.executable, SOURCE_DRIVER)
    return ExecutorPython(ARCHIVE_PYTHON, SOURCE_ARCHIVE, executor_archive(modules=modules))


def main() -> int:
    """``python -m jobs.pyenv`` (``make executor-env``): pack the executors' environment
    for the pipeline modules of the settings now, or find it in the cache, and print its
    path and what it holds."""
    from core.settings import Settings

    modules = Settings().pipeline_modules
    try:
        archive = executor_archive(modules=modules)
        dists = closure(executor_distributions(modules))
    except PackError as error:
        print(f"executor-env: {error}", file=sys.stderr)
        return 1
    print(archive)
    for dist in dists:
        print(f"  {dist.metadata['Name']}=={dist.version}")
    print(f"  (bin/python -> {base_python()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
