"""bench/overhead.py's guard: it times runs from nothing, so it refuses a working directory holding an
earlier run's token cache and trials (a rerun there would reuse them and time runs that train nothing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "overhead.py"


def test_it_refuses_a_working_directory_an_earlier_run_left(tmp_path):
    (tmp_path / "seeds1-0" / "cache").mkdir(parents=True)
    refused = subprocess.run(
        [sys.executable, str(SCRIPT), "--work", str(tmp_path)], capture_output=True, text=True
    )
    assert refused.returncode == 2 and f"--work {tmp_path} is not empty" in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seeds1-0"]  # nothing was started or written
