"""Print the project's requirements from pyproject.toml, one per line, for pip -r.

The image installs its dependencies in a layer of their own, before the sources are
copied, so that a change to the code does not download them all again.

    python ops/docker/requirements.py            # the project's dependencies
    python ops/docker/requirements.py batch      # one extra's requirements only
    python ops/docker/requirements.py --pin pyspark   # the version pinned with ==
    python ops/docker/requirements.py --build-system  # what building the wheel needs
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def requirements(project: dict[str, object], extra: str | None) -> list[str]:
    """The dependencies of the project, or those of one optional extra."""
    if extra is None:
        deps = project.get("dependencies", [])
    else:
        extras = project.get("optional-dependencies", {})
        if not isinstance(extras, dict) or extra not in extras:
            raise SystemExit(f"no extra named {extra!r} in pyproject.toml")
        deps = extras[extra]
    if not isinstance(deps, list):
        raise SystemExit("pyproject.toml: dependencies must be a list")
    return [str(dep) for dep in deps]


def pinned_version(reqs: list[str], name: str) -> str:
    """The version that ``name==X`` pins among ``reqs``."""
    pattern = re.compile(rf"^{re.escape(name)}(\[[^\]]*\])?\s*==\s*([^\s;,]+)", re.IGNORECASE)
    for req in reqs:
        match = pattern.match(req)
        if match:
            return match.group(2)
    raise SystemExit(f"{name} is not pinned with == in pyproject.toml")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("extra", nargs="?", default=None)
    parser.add_argument("--pin", metavar="NAME", help="print the == version of NAME")
    parser.add_argument("--build-system", action="store_true", help="print [build-system] requires")
    parser.add_argument("--pyproject", type=Path, default=PYPROJECT)
    args = parser.parse_args(argv)
    with args.pyproject.open("rb") as handle:
        document = tomllib.load(handle)
    project = document["project"]
    if args.build_system:
        print("\n".join(str(req) for req in document["build-system"]["requires"]))
        return 0
    if args.pin:
        every = requirements(project, None)
        for extra in project.get("optional-dependencies", {}):
            every += requirements(project, extra)
        print(pinned_version(every, args.pin))
        return 0
    print("\n".join(requirements(project, args.extra)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
