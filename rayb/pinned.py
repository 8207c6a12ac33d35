"""The exact package set rayb's test suite passed on, and whether this machine runs it.

`rayb/constraints.txt` pins every package that installing rayb with its `dev` extra resolves (torch
aside: a CPU machine installs the local `torch==2.13.0` wheel first, a GPU machine keeps its own CUDA
build). The README's commands and CI install through it (`pip install -c rayb/constraints.txt ...`), so
a verdict does not change with the day it was installed. It ships inside the package, so a study run
from an installed rayb, or from a `ray job submit` working directory, still knows what it was tested on.

Regenerate it after upgrading the environment and passing the suite: `python -m rayb.pinned --write`.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement

CONSTRAINTS = Path(__file__).with_name("constraints.txt")
# Installed separately, per machine: not pinned, not compared.
UNPINNED = {"rayb", "torch", "pip", "setuptools", "wheel"}
# The rest of the pinned set is GPU-only; pip applies a constraint only to what it installs.
GPU_ONLY = {"mamba-ssm": "2.3.2.post1", "causal-conv1d": "1.7.0", "flash-linear-attention": "0.6.0"}
EXTRAS = ("dev", "track", "cuda")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(path: Path = CONSTRAINTS) -> dict[str, str]:
    """{package: version} from a constraints file of `name==version` lines."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonical(name)] = version.strip()
    return pins


def installed() -> dict[str, tuple[str, list[str]]]:
    """{package: (version, requirements)} of every installed distribution, read in one pass, the first on
    the path winning as in an import. importlib.metadata's lookup by name searches the whole path again,
    and the check's 1,400 lookups took 0.24-0.29 s of each run's start, against 0.12-0.13 s (2 cores)."""
    found = {}
    for dist in importlib.metadata.distributions():
        meta = dist.metadata
        if meta["Name"]:  # a stale metadata directory has none
            found.setdefault(canonical(meta["Name"]), (meta["Version"], meta.get_all("Requires-Dist") or []))
    return found


def mismatches(pins: dict[str, str] | None = None) -> dict[str, tuple[str, str | None]]:
    """{package: (pinned, installed or None)} for every pinned package installed at another version.
    A pinned package that is absent counts only if rayb itself needs it (extras are optional)."""
    pins = pinned() if pins is None else pins
    have = installed()
    needed = closure(have, extras=())
    out = {}
    for name, version in sorted(pins.items()):
        here = have.get(name, (None,))[0]
        if here != version and (here is not None or name in needed):
            out[name] = (version, here)
    return out


def summary(diff: dict[str, tuple[str, str | None]], most: int = 4) -> str:
    """One line: which installed packages differ from the tested set, and how to install it."""
    parts = [
        f"{name} {have or 'missing'} (tested {want})" for name, (want, have) in list(diff.items())[:most]
    ]
    more = f" and {len(diff) - most} more" if len(diff) > most else ""
    return (
        f"installed packages differ from rayb's tested set: {', '.join(parts)}{more}; results may differ. "
        f"Install the tested set with: pip install -c {CONSTRAINTS} -e ."
    )


def closure(
    have: dict[str, tuple[str, list[str]]], root: str = "rayb", extras: tuple[str, ...] = EXTRAS
) -> set[str]:
    """The distributions `root` (with `extras`) needs, transitively, given what is installed (`have`):
    those installed, and those missing that an installed one requires."""
    seen: set[str] = set()
    todo = [(canonical(root), set(extras))]
    while todo:
        name, wanted = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name not in have:
            continue
        for text in have[name][1]:
            req = Requirement(text)
            env = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(e) for e in env):
                todo.append((canonical(req.name), set(req.extras)))
    return seen


def freeze() -> str:
    """The constraints file for what is installed now: rayb's dependency closure, exactly."""
    have = installed()
    lines = [f"{name}=={have[name][0]}" for name in sorted(closure(have) - UNPINNED) if name in have]
    lines += [f"{name}=={version}  # GPU only (the cuda extra)" for name, version in GPU_ONLY.items()]
    header = (
        "# The package set rayb's test suite passed on (python -m rayb.pinned --write regenerates it).\n"
        "# torch is not here: CPU machines install torch==2.13.0 first, GPU machines keep their build.\n"
    )
    return header + "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        CONSTRAINTS.write_text(freeze())
        print(f"wrote {CONSTRAINTS}")
    else:
        diff = mismatches()
        print(summary(diff) if diff else "installed packages match rayb's tested set")
