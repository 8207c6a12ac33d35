"""bench/overhead.py's guard and CPU meter. The guard: it times runs from nothing, so it refuses a working
directory holding an earlier run's token cache and trials (a rerun there would reuse them and time runs
that train nothing). The meter: what a run's processes spent, by kind, from the titles Ray gives them."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    run = {"wall_s": 60.0, "stages": stages, "trials": trials, "exit_s": 0.75, "drained_evaluation_s": 1.25}
    path = overhead.timeline(run)
    assert sum(path.values()) == 60.0
    assert path["training steps"] == 23.0 and path["set_up"] == 3.2 and path["worker imports"] == 2.0
    assert path["process start, imports"] == 60.0 - sum(stages.values()) - 0.75
    assert path["Train around trials"] == pytest.approx(40.0 - 4.0 - 2.0 - 3.2 - 23.0 - 2 * 1.75 - 1.25)
    # Each trial repeats its steps, checkpoints and validation (1.5 s) and its saving (0.25 s), and is
    # evaluated: here, once the last had trained, by the drained worker (1.25 s on the critical path).
    assert overhead._fixed_s(path) == 60.0 - 23.0 - 2 * 1.75 - 1.25


def test_the_drained_workers_evaluation_is_the_training_stages_wall_after_its_last_trial(tmp_path):
    def landed(relative, at):
        path = tmp_path / "trials" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
        os.utime(path, (at, at))

    landed("a/train_result.json", 100.0)
    landed("b/train_result.json", 130.0)
    landed("a/eval/lm-1.json", 120.0)  # beside b's training: off the critical path
    landed("b/eval/lm-1.json", 132.5)
    landed("a/eval/lm-2.json", 140.0)  # after the training stage: its own stage, timed apart
    assert overhead.drained_evaluation_s(tmp_path, training_ended=135.0) == 2.5
    assert overhead.drained_evaluation_s(tmp_path, training_ended=131.0) == 0.0


def test_a_fixed_cost_is_only_read_off_a_line_through_runs_training_as_many_groups_at_once(capsys):
    def runs(walls, groups):
        return {n: {"wall_s": wall, "groups": groups[n]} for n, wall in walls.items()}

    rayb = runs({1: 36.0, 3: 88.0, 10: 226.0}, {1: 1, 3: 1, 10: 2})
    plain = runs({1: 28.0, 3: 78.0, 10: 235.0}, {1: 1, 3: 1, 10: 1})
    overhead.lines([1, 3, 10], rayb, plain)
    out = capsys.readouterr().out
    # 3 to 10 seeds: (226 - 88) / 7 = 19.7 s a trial, against (235 - 78) / 7 = 22.4 s; its intercept (28 s)
    # is no fixed cost. 1 to 3 seeds: 26 s a trial against 25 s, and 36 - 26 = 10 s of fixed cost.
    assert "3 to 10 seeds (1 then 2 worker groups at once): rayb 19.7 s, plain loop 22.4 s: 0.88×" in out
    assert "1 to 3 seeds (1 worker group at once): rayb 26.0 s, plain loop 25.0 s: 1.04×" in out
    assert out.count("fixed cost") == 1 and "a study's fixed cost, that line's intercept: 10.0 s" in out
    overhead.lines([3, 10], rayb, plain)
    assert "no two seed counts trained the same number of worker groups at once" in capsys.readouterr().out
