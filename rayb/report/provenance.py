"""Provenance: what produced a study's results, recorded when it runs so a rebuilt report still says it.

The record holds the validated study (every default filled in) and its hash, the reference model, the
data's unigram entropy, rayb's git commit, the versions of the packages that shape a result and whether
they are the tested set, the hardware (the driver's machine and the Ray cluster the trials ran on), and
the self-checks run before training (added by the runner).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rayb.study import Study

PROVENANCE_NAME = "provenance.json"

PACKAGES = (
    "rayb", "torch", "ray", "deepspeed", "transformers", "lm-eval", "tokenizers",
    "numpy", "scipy", "pandas", "pyarrow",
)  # fmt: skip


def collect(study: Study, unigram_entropy_nats: float | None, cluster: dict[str, Any]) -> dict[str, Any]:
    """The provenance record of a run of `study` on `cluster` (Ray's resource totals)."""
    return {
        "study": study.model_dump(mode="json"),
        "fingerprint": study.fingerprint(),
        "reference": study.reference,
        "unigram_entropy_nats": unigram_entropy_nats,
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git": git_state(),
        "versions": versions(),
        "pinned": pinned_state(),
        "hardware": hardware() | {"ray_cluster": cluster},
    }


def git_state(path: Path | None = None) -> dict[str, Any]:
    """rayb's source commit and whether it had uncommitted changes; {} when not a git checkout
    (an installed wheel, or a `ray job submit` working directory, which ships without .git)."""
    where = str(path or Path(__file__).resolve().parent)

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", where, *args], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()

    try:
        return {
            "commit": git("rev-parse", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        }
    except (OSError, subprocess.SubprocessError):
        return {}


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            out[package] = "not installed"
    return out


def pinned_state() -> dict[str, Any]:
    """Whether the installed packages are the set rayb was tested on (rayb/constraints.txt), and which
    differ: {package: [tested, installed or None]}."""
    from rayb import pinned

    differs = pinned.mismatches()
    return {"matches": not differs, "differs": {name: list(pair) for name, pair in differs.items()}}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware() -> dict[str, Any]:
    """The driver's machine. (Trials may run elsewhere: see ray_cluster.)"""
    import psutil
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "host_os": f"{platform.system()} {platform.release()}",
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "gpus": gpus,
    }
