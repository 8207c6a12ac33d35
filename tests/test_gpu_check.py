"""bench/gpu_check.py's pieces that run without a GPU: its help, its refusal without one, the packing
verdict, the MFU measurements it records for `rayb plan`, the precisions it reports beside MFU, and the
data its studies train on."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rayb.mfu import read_measurements, record_measurements

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"
_spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
gc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gc)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_it_explains_itself_and_refuses_without_a_gpu():
    help_text = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True
    )
    assert "ten seeds packed" in help_text.stdout and "--measured-out" in help_text.stdout
    refused = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert refused.returncode == 1 and "no CUDA device" in refused.stderr


def test_the_packing_verdict_holds_ten_seeds_to_three_times_one():
    assert "2.50× one seed's wall (goal ≤ 3×: met)" in gc.packing_verdict((1e5, 100.0), (4e5, 250.0))
    missed = gc.packing_verdict((1e5, 100.0), (1.5e5, 320.0))
    assert "3.20× one seed's wall (goal ≤ 3×: MISSED); together at 1.50× one seed's tokens/s" in missed
    assert "(rayb plan assumes 1.38×)" in missed


def test_a_measurement_is_what_rayb_plan_reads_for_that_gpu(tmp_path):
    flops = gc.flops_per_token(gc.SMALL)
    packed = gc.measurement("NVIDIA H100 80GB HBM3", gc.SMALL, flops, 2e6, 989e12, 10, "bf16")
    assert packed.gpu == "h100" and packed.trials_per_gpu == 10
    assert packed.mfu == pytest.approx(2e6 * flops / 989e12)
    record_measurements(tmp_path / "mfu.json", [packed])
    assert read_measurements(tmp_path / "mfu.json", "h100") == [packed]
    assert gc.gpu_of("NVIDIA A100-SXM4-40GB") == "a100" and gc.gpu_of("Tesla V100") is None
    assert gc.gpu_of("NVIDIA L4") == "l4" and gc.gpu_of("NVIDIA L40S") is None


def test_precisions_come_from_the_trials_own_records(tmp_path):
    (tmp_path / "eval").mkdir()
    (tmp_path / "train_result.json").write_text(json.dumps({"precision": "bf16"}))
    assert gc.precisions(tmp_path) == ("bf16", "not run")
    (tmp_path / "eval" / "lm-1.json").write_text(json.dumps({"precision": "bf16 autocast over fp32 weights"}))
    assert gc.precisions(tmp_path) == ("bf16", "bf16 autocast over fp32 weights")
    assert (
        gc.describe_precisions(*gc.precisions(tmp_path))
        == "training bf16, evaluation bf16 autocast over fp32 weights"
    )


def test_its_shortest_study_has_the_data_it_asks_for(ray_session, tmp_path):
    """The check's studies write their own random corpus: at the fewest steps it is run with, the corpus
    still holds the held-out rows (a random 1% of its documents), so a GPU run never stops at the data."""
    from rayb.data.pipeline import prepare_data

    study = gc.gpu_study(tmp_path, "gpu-check", gc.SMALL, 1, 4, 32, 17)
    cache = prepare_data(study.data, tmp_path / "out")
    assert cache.manifest["train_rows"] == 17 * 32 and cache.manifest["val_rows"] > 0
    assert len(list((tmp_path / "data").glob("*.parquet"))) > 1  # Ray Data tokenizes files side by side


def test_the_packing_studies_share_their_tokens_and_none_of_their_trials(tmp_path):
    """The seed trained alone and the ten packed ones share one output: one token cache, tokenized once,
    and no trial, though a GPU share stays out of a trial's key (so a shared seed would be found trained)."""
    alone, packed = (
        gc.gpu_study(tmp_path, name, gc.SMALL, seeds, 4, 32, 17, num_workers=1, **share)
        for name, seeds, share in [("alone", gc.ALONE_SEEDS, {}), ("packed", 10, {"gpus_per_trial": 0.1})]
    )
    assert alone.data == packed.data

    def keys(study, seeds):
        return {study.trial_key(study.models[0], study.train.lr, seed, "data") for seed in seeds}

    assert keys(alone, alone.seeds).isdisjoint(keys(packed, packed.seeds))
    assert keys(alone, [0]) == keys(packed, [0])


@pytest.mark.skipif(gc.mps_running(), reason="an MPS daemon runs on this machine")
def test_it_says_whether_it_ran_under_cuda_mps_and_asks_for_mps_clearly(monkeypatch, tmp_path):
    """Without the MPS daemon's program `--mps` stops, naming it; without `--mps` the run says MPS was off,
    or on where a daemon started outside the check already runs (its processes share the GPU through it:
    here a process under the daemon's name)."""
    daemon = tmp_path / gc.MPS_CONTROL
    shutil.copy(shutil.which("sleep"), daemon)
    monkeypatch.setattr(gc.shutil, "which", lambda name: None)
    with gc.cuda_mps(False) as mps:
        assert mps == "off"
    with pytest.raises(SystemExit, match="nvidia-cuda-mps-control is not on PATH"), gc.cuda_mps(True):
        pass
    with subprocess.Popen([daemon, "60"]) as running:
        try:
            with gc.cuda_mps(False) as mps:
                assert mps == "on (a daemon started outside this check)"
        finally:
            running.kill()


def test_under_mps_the_daemon_stops_however_the_run_ends(monkeypatch, tmp_path, capsys):
    """NVIDIA's MPS control program cannot run here: a stand-in on PATH records what it is asked. The check
    starts the daemon and stops it at the end, also where the run ends in SystemExit (as a SIGTERM ends it),
    naming the MPS servers that ran (the processes that used MPS went through them)."""
    asked = tmp_path / "asked"
    control = tmp_path / "bin" / gc.MPS_CONTROL
    control.parent.mkdir()
    control.write_text(  # the daemon's start reads nothing; a command to it comes on its standard input
        f'#!/bin/sh\nif [ "$1" = -d ]; then echo -d >> {asked}; else cat >> {asked}; echo 1234; fi\n'
    )
    control.chmod(0o755)
    monkeypatch.setenv("PATH", f"{control.parent}:{os.environ['PATH']}")
    before = signal.getsignal(signal.SIGTERM)
    with gc.cuda_mps(True) as mps:
        assert mps == "on" and asked.read_text().split() == ["-d"]
    assert asked.read_text().split() == ["-d", "get_server_list", "quit"]
    assert "CUDA MPS servers that ran: 1234" in capsys.readouterr().out
    asked.unlink()
    with pytest.raises(SystemExit), gc.cuda_mps(True):
        raise SystemExit(128 + signal.SIGTERM)
    assert asked.read_text().split() == ["-d", "get_server_list", "quit"]
    assert signal.getsignal(signal.SIGTERM) == before  # ignored only while the daemon is told to stop


def test_a_sigterm_ends_the_run_once_its_cleanup_is_done():
    """Under Ray's own handling a driver is killed about 3 s after a SIGTERM, its cleanup unfinished; under
    the check's (set once Ray runs) a run cut short finishes its cleanup, here one that waits 4 s on Ray,
    and then exits. In a process of its own: Ray's handling would kill this one."""
    script = f"""
import importlib.util, os, signal, threading, time
spec = importlib.util.spec_from_file_location("gpu_check", {str(SCRIPT)!r})
gc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gc)
import ray
with gc.sigterm_exits():
    slow = ray.remote(num_cpus=0)(lambda: time.sleep(4) or "finished")
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    try:
        ray.get(ray.remote(num_cpus=0)(lambda: time.sleep(60)).remote())
    finally:
        print("cleanup", ray.get(slow.remote()), flush=True)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "cleanup finished" in run.stdout, run.stdout + run.stderr[-2000:]
    assert run.returncode > 0  # it exited, with an error, rather than being killed by a signal


def test_trials_cut_short_still_report_their_rates_so_far(tmp_path, capsys):
    """A lease's time limit can end the packed run before its trials finish: their per-step logs (the last
    line perhaps half written) still give each one's median tokens/s so far, and the sum."""
    for name, rates in [("a", [9.0, 100.0, 300.0, 200.0]), ("b", [9.0, 50.0]), ("c", [9.0])]:
        (tmp_path / name).mkdir()
        lines = [json.dumps({"kind": "train", "step": i + 1, "tokens_per_s": r}) for i, r in enumerate(rates)]
        (tmp_path / name / "metrics.jsonl").write_text("\n".join(lines) + '\n{"kind": "tra')
    (tmp_path / "d").mkdir()  # a trial whose worker had not started
    assert gc.step_rates(tmp_path / "a", warmup=1) == [100.0, 300.0, 200.0]  # the half line is not read
    gc.print_so_far(sorted(tmp_path.iterdir()), warmup=1)
    assert (
        "cut short: 2 of 4 trials past step 1, at 200, 50 tokens/s; together 250 tokens/s"
        in capsys.readouterr().out
    )
