"""bench/overhead.py's guard and CPU meter. The guard: it times runs from nothing, so it refuses a working
directory holding an earlier run's token cache and trials (a rerun there would reuse them and time runs
that train nothing). The meter: what a run's processes spent, by kind, from the titles Ray gives them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "overhead.py"
_spec = importlib.util.spec_from_file_location("overhead", SCRIPT)
overhead = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(overhead)

# Spends `seconds` of its own CPU time, whatever else the machine runs.
BURN = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < float(sys.argv[1]): pass\n"


def test_it_refuses_a_working_directory_an_earlier_run_left(tmp_path):
    (tmp_path / "seeds1-0" / "cache").mkdir(parents=True)
    refused = subprocess.run(
        [sys.executable, str(SCRIPT), "--work", str(tmp_path)], capture_output=True, text=True
    )
    assert refused.returncode == 2 and f"--work {tmp_path} is not empty" in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seeds1-0"]  # nothing was started or written


def test_the_cpu_meter_splits_a_run_by_the_kind_of_each_process(tmp_path):
    burn = tmp_path / "burn.py"
    burn.write_text(BURN)
    # A driver that starts a process titled as Ray titles a Train worker's (`exec -a` sets its argv[0]),
    # which spends 1 s of CPU and ends before the driver, which spends 0.5 s of its own.
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import subprocess, sys\n"
        "subprocess.run(['bash', '-c', "
        f"'exec -a ray::RayTrainWorker.train_fn {sys.executable} {burn} 1.0'])\n"
        f"subprocess.run([sys.executable, {str(burn)!r}, '0'])\n"  # an untitled helper, briefly
        + BURN.replace("float(sys.argv[1])", "0.5")
    )
    meter = overhead.CpuMeter()
    overhead._timed([sys.executable, str(driver)], meter)
    split = meter.split()
    # Up to a sample's interval of each process's last moments goes unseen; a slow start adds a little.
    assert 0.7 < split["Train workers"] < 1.3
    assert 0.3 < split[overhead.DRIVER] < 1.0
    assert meter.total >= split["Train workers"] + split[overhead.DRIVER]  # the machine's whole busy time
    assert split[overhead.UNSEEN] == meter.total - sum(v for k, v in split.items() if k != overhead.UNSEEN)
