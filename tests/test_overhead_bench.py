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


def test_the_cpu_meter_splits_a_run_by_the_kind_of_each_process(tmp_path, monkeypatch):
    # A process's start time as psutil gives it moves with the system clock (boot time plus ticks since):
    # here it moves at every read, and still each process counts once.
    monkeypatch.setattr(overhead.psutil.Process, "create_time", lambda self: overhead.time.time())
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


def test_the_timeline_splits_the_whole_wall_and_the_fixed_cost_is_what_no_trial_repeats():
    def trial(group, wall_s, first=False):
        timings = {"checkpoint_s": 1.0, "validation_s": 0.5, "save_model_s": 0.25, "set_up_s": 0.2}
        if first:  # what the group's start cost, charged to its first trial
            timings |= {"worker_start_s": 4.0, "worker_process_s": 1.0, "process_group_s": 0.5,
                        "imports_s": 2.0, "set_up_s": 3.0}  # fmt: skip
        return {"worker_group": group, "wall_s": wall_s, "timings": timings}

    # Group b finishes last: its start and its two trials make the critical path.
    trials = [trial("a", 10.0, first=True), trial("b", 12.0, first=True), trial("b", 11.0)]
    stages = {"ray_start_s": 5.0, "data_s": 1.0, "self_checks_s": 0.5, "planning_s": 0.25, "training_s": 40.0,
              "evaluation_after_training_s": 2.0, "report_s": 1.5}  # fmt: skip
    run = {"wall_s": 60.0, "stages": stages, "trials": trials, "exit_s": 0.75}
    path = overhead.timeline(run)
    assert sum(path.values()) == 60.0
    assert path["training steps"] == 23.0 and path["set_up"] == 3.2 and path["worker imports"] == 2.0
    assert path["process start, imports"] == 60.0 - sum(stages.values()) - 0.75
    # Each trial repeats its steps, checkpoints and validation (1.5 s) and its saving (0.25 s).
    assert overhead._fixed_s(path) == 60.0 - 23.0 - 2 * 1.75
