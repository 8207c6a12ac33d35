"""The canary for tomorrow's libraries: rayb's parity tests on the newest release of every dependency.

    python tests/canary.py [--venv DIR] [--keep]

Builds a virtual environment with the newest release of each package rayb (with its dev extra) depends
on, ignoring rayb/constraints.txt and pyproject's upper bounds (torch stays at the CPU wheel
torch==2.13.0: an open range pulls the CUDA build), runs `pytest -m parity` there (every decoder and fast
path against its reference, rayb's kernels against transformers' and fla's own), and prints which
packages moved from the tested set and which tests broke. Exit code 1 when a test broke. Run it before
moving a pin; takes a few minutes, most of it pip.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from packaging.requirements import Requirement  # noqa: E402

from rayb.pinned import canonical, pinned  # noqa: E402

CPU_TORCH = "torch==2.13.0"


def unbounded_requirements() -> list[str]:
    """rayb's dependencies with its dev extra, by name (extras kept), without version bounds."""
    out = []
    for text in importlib.metadata.requires("rayb") or []:
        req = Requirement(text)
        name = canonical(req.name)
        applies = req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("dev", "track"))
        if applies and name not in ("rayb", "torch"):
            out.append(req.name + (f"[{','.join(sorted(req.extras))}]" if req.extras else ""))
    return out


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    print("$", " ".join(cmd), flush=True)
    return subprocess.run(cmd, text=True, **kwargs)


def build(venv: Path) -> Path:
    run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as torch_only:
        torch_only.write(CPU_TORCH + "\n")  # the one pin kept: the CPU wheel
    run([*pip, CPU_TORCH], check=True)
    run([*pip, "--upgrade", "-c", torch_only.name, *unbounded_requirements()], check=True)
    run([*pip, "--no-deps", "-e", str(ROOT)], check=True)
    return python


def moved(python: Path) -> list[tuple[str, str, str]]:
    """(package, tested, newest installed) for each pinned package whose version differs."""
    frozen = run(
        [str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, check=True
    ).stdout
    have = {canonical(n): v for n, _, v in (line.partition("==") for line in frozen.splitlines()) if v}
    return [
        (name, want, have[name]) for name, want in pinned().items() if name in have and have[name] != want
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, help="where to build it (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the environment afterwards")
    args = parser.parse_args()
    venv = args.venv or Path(tempfile.mkdtemp(prefix="rayb-canary-")) / "venv"
    try:
        python = build(venv)
        changed = moved(python)
        tests = run([str(python), "-m", "pytest", "-q", "-m", "parity", "-p", "no:cacheprovider", "-rf"],
                    cwd=ROOT, capture_output=True)  # fmt: skip
    finally:
        if not args.keep:
            shutil.rmtree(venv, ignore_errors=True)
    print("\n== moved from rayb/constraints.txt ==")
    for name, want, have in changed:
        print(f"  {name}: {want} -> {have}")
    print("  (none)" if not changed else f"  {len(changed)} packages")
    print("\n== parity tests on the newest releases ==")
    lines = tests.stdout.splitlines()
    print("\n".join([line for line in lines if line.startswith("FAILED")] + lines[-1:]))
    return 0 if tests.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
