"""Experiment trackers (study file `tracking:`), read back with each library's own reader, all offline:
TensorBoard's EventAccumulator, MLflow's client on a local file store, W&B's offline run directory."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest
import yaml
from conftest import tiny_study_dict
from typer.testing import CliRunner

from rayb.eval.actors import result_path
from rayb.study import StudyError, parse_study
from rayb.track.driver import TRACKED, Guarded, Tracking, run_name
from rayb.train.loop import METRICS
from rayb.train.trial import TRAIN_DONE, TrialSpec

STEPS = 6


@pytest.fixture(scope="module", autouse=True)
def wandb_dir(tmp_path_factory):
    """W&B never reaches the network; MLflow's file store is what these tests read."""
    wandb_dir = tmp_path_factory.mktemp("wandb_dir")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_MODE", "offline")
        env.setenv("WANDB_SILENT", "true")
        env.setenv("WANDB_DIR", str(wandb_dir))
        env.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        yield wandb_dir


def _study(tracking: dict, **overrides):
    raw = tiny_study_dict(models=[{"arch": "gpt2", "config": {"d_model": 32, "n_layer": 2, "n_head": 2}}],
                          seeds=1, tracking=tracking, **overrides)  # fmt: skip
    return parse_study(raw)


# ----- the study file -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tracking", "expected"),
    [
        ({"wandb": {"entity": "team"}}, "tracking.wandb.project: required field is missing"),
        (
            {"wandb": True},
            "tracking.wandb: Value error, give the project as a mapping: `wandb: {project: NAME}`",
        ),
        ({"mlflow": "ftp://host/x"}, "tracking.mlflow: 'ftp://host/x' is not an MLflow tracking URI"),
        (
            {"mlflow": "http:///nohost"},
            "tracking.mlflow: 'http:///nohost': an MLflow server URI is http(s)://HOST",
        ),
        ({"neptune": True}, "tracking.neptune: unknown field"),
    ],
)
def test_invalid_tracking_fields_are_named(tracking, expected):
    with pytest.raises(StudyError) as err:
        _study(tracking)
    assert expected.replace("Value error, ", "") in str(err.value)


def test_tracking_changes_no_hash():
    plain = _study({})
    tracked = _study({"tensorboard": True, "mlflow": "/tmp/mlruns", "wandb": {"project": "p"}})
    assert tracked.fingerprint() == plain.fingerprint()
    model = plain.models[0]
    assert tracked.trial_key(model, 1e-3, 0, "data") == plain.trial_key(model, 1e-3, 0, "data")
    assert "tracking" not in plain.hashed()


def test_a_missing_library_is_named_before_any_work(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "wandb" else find_spec(name)
    )
    with pytest.raises(
        StudyError, match=r"tracking.wandb: needs the wandb package.*pip install 'rayb\[track\]'"
    ):
        _study({"wandb": {"project": "p"}})


# ----- each tracker, fed from a trial's files -----------------------------------------------------------


def _trial(study, out: Path) -> TrialSpec:
    return TrialSpec(key="k1", model="gpt2", arch="gpt2", model_config={"d_model": 32, "n_layer": 2},
                     lr=3e-3, seed=0, train=study.train, steps=STEPS, cache_dir="", storage_path="",
                     trial_dir=str(out / "trials" / "gpt2-k1"))  # fmt: skip


def _train(step: int) -> dict:
    return {"kind": "train", "step": step, "loss": 6.0 - step / 2, "lr": 1e-3 * step, "grad_norm": 1.0 / step,
            "tokens": 256 * step, "tokens_per_s": 1000.0 + step, "step_s": 0.25}  # fmt: skip


def _append(path: Path, *records: dict) -> None:
    with path.open("a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def _feed(study, trial: TrialSpec, study_dir: Path, log) -> None:
    """A trial trained while tracking runs (resumed once, so steps 3-4 are written twice), then evaluated."""
    trial_dir = Path(trial.trial_dir)
    trial_dir.mkdir(parents=True, exist_ok=True)
    metrics = trial_dir / METRICS
    _append(metrics, *(_train(s) for s in range(1, 5)), {"kind": "val", "step": 4, "val_loss": 4.5})
    synced = []  # when the trackers' files were copied to where the study lives
    tracking = Tracking(study, [trial], study_dir, log, poll_s=0.05, sync=lambda: synced.append(time.time()))
    tracking.start()
    time.sleep(0.5)
    _append(
        metrics,
        _train(3) | {"loss": 99.0},
        *(_train(s) for s in (4, 5, 6)),
        {"kind": "val", "step": 6, "val_loss": 4.0},
    )
    (trial_dir / TRAIN_DONE).write_text(json.dumps({"status": "ok", "steps": STEPS, "final_train_loss": 3.5,
                                                    "params_total": 1234, "tokens_per_s": 1003.5}))  # fmt: skip
    time.sleep(0.3)
    out = Path(result_path(trial_dir, "lm", {}))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"status": "ok", "version": 1, "metrics": {"val_loss": 3.9, "val_ppl": 49.4}}))
    deadline = time.time() + 30  # a loaded machine may take a while to schedule the thread
    while not synced and time.time() < deadline:
        time.sleep(0.05)
    assert len(synced) == 1  # as soon as the trial's runs ended, not only when the study ends
    tracking.stop()
    report = study_dir / "report.md"
    report.write_text("# tiny\n")
    tracking.finish_study([report])


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("tracked")
    study = _study({"tensorboard": True, "mlflow": (tmp_path / "mlruns").as_uri(), "wandb": {"project": "p"}})
    study_dir = tmp_path / "study"
    study_dir.mkdir()
    trial, messages = _trial(study, tmp_path), []
    _feed(study, trial, study_dir, messages.append)
    assert messages == []
    return study, trial, study_dir, tmp_path


def test_tensorboard_event_files(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, trial, study_dir, _ = tracked
    events = EventAccumulator(str(study_dir / "tensorboard" / run_name(trial)))
    events.Reload()
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == list(range(1, STEPS + 1))
    assert loss[2].value == 4.5  # the first step 3 logged; its replay after the resume is not logged again
    for tag in ("train/lr", "train/grad_norm", "train/tokens_per_s"):
        assert len(events.Scalars(tag)) == STEPS
    assert [(e.step, e.value) for e in events.Scalars("val/loss")] == [(4, 4.5), (6, 4.0)]
    assert [(e.step, round(e.value, 3)) for e in events.Scalars("eval/lm/val_loss")] == [(STEPS, 3.9)]


def _mlflow_runs(uri: str, name: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    return client, parent, [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]


def test_mlflow_runs(tracked):
    study, trial, _, tmp_path = tracked
    client, parent, (child,) = _mlflow_runs((tmp_path / "mlruns").as_uri(), study.name)
    assert parent.info.status == "FINISHED" and [
        a.path for a in client.list_artifacts(parent.info.run_id)
    ] == ["report.md"]
    assert child.info.status == "FINISHED" and child.info.run_name == run_name(trial)
    params = child.data.params
    assert params["model_config.d_model"] == "32" and params["train.global_batch"] == "8"
    assert params["lr"] == "0.003" and params["trial_key"] == "k1"
    history = client.get_metric_history(child.info.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == [(s, 6.0 - s / 2) for s in range(1, STEPS + 1)]
    assert child.data.metrics["eval/lm/val_loss"] == 3.9 and child.data.metrics["result/params_total"] == 1234


def _wandb_records(run_dir: Path) -> list:
    """The records of a W&B offline run, parsed with W&B's protobuf schema. W&B's Python reader of the
    .wandb log (wandb.sdk.internal.datastore) is gone from its client since its core moved to Go; this
    reads its framing: a 7-byte header, then LevelDB-log chunks (crc32, length, type) in 32 KiB blocks."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("*.wandb")
    data, pos, chunk, records = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if (left := 32768 - pos % 32768) < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # padding to the end of a block
            pos += left
            continue
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or a record's last chunk
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def _wandb_run(wandb_dir: Path, name: str) -> tuple[dict, list[dict], dict]:
    """(config, history rows, summary) of the offline run named `name`."""
    for run_dir in sorted((wandb_dir / "wandb").glob("offline-run-*")):
        records = _wandb_records(run_dir)
        (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        if run.display_name != name:
            continue
        config = {u.key: json.loads(u.value_json) for u in run.config.update}
        history = [{"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
                   for r in records if r.WhichOneof("record_type") == "history"]  # fmt: skip
        summary = {}
        for r in records:
            if r.WhichOneof("record_type") == "summary":
                summary |= {
                    "/".join(u.nested_key) or u.key: json.loads(u.value_json) for u in r.summary.update
                }
        return config, history, summary | {"_group": run.run_group}
    raise AssertionError(f"no offline W&B run named {name}")


def test_wandb_offline_run(tracked, wandb_dir):
    study, trial, _, _ = tracked
    config, history, summary = _wandb_run(wandb_dir, run_name(trial))
    assert config["model_config.d_model"] == 32 and config["seed"] == 0
    assert [row["_step"] for row in history] == list(range(1, STEPS + 1))
    assert [row["train/loss"] for row in history] == [6.0 - s / 2 for s in range(1, STEPS + 1)]
    assert history[3]["val/loss"] == 4.5 and history[5]["val/loss"] == 4.0
    assert summary["eval/lm/val_loss"] == 3.9 and summary["_group"] == study.name


def test_a_rerun_logs_a_tracked_trial_once(tracked, wandb_dir):
    study, trial, study_dir, tmp_path = tracked
    assert len(json.loads((Path(trial.trial_dir) / TRACKED).read_text())["destinations"]) == 3
    again = Tracking(study, [trial], study_dir, print, poll_s=0.05)
    again.start()
    again.stop()
    again.finish_study([])
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    runs = client.search_runs([client.get_experiment_by_name(study.name).experiment_id])
    assert sum(r.data.tags.get("rayb.trial_key") == "k1" for r in runs) == 1  # and a parent run per run
    assert len(list((wandb_dir / "wandb").glob("offline-run-*"))) == 1


# ----- failures -----------------------------------------------------------------------------------------


def test_an_unreachable_server_warns_once_and_never_raises(tmp_path):
    study = _study({"mlflow": "http://127.0.0.1:1", "tensorboard": True})
    study_dir = tmp_path / "study"
    study_dir.mkdir()
    messages = []
    began = time.perf_counter()
    _feed(study, _trial(study, tmp_path), study_dir, messages.append)
    assert time.perf_counter() - began < 10
    (warning,) = messages
    assert warning.startswith("tracking: mlflow at http://127.0.0.1:1 failed: ConnectionError")
    assert warning.endswith("the study goes on without it")
    assert (study_dir / "tensorboard").is_dir()  # the other tracker carried on


def test_a_tracker_failing_midway_warns_once(monkeypatch):
    from rayb.track import TRACKERS, Tracker

    class Flaky(Tracker):
        destination = "flaky at nowhere"

        def log(self, key, rows):
            raise OSError("disk full")

    monkeypatch.setattr(TRACKERS, "get", lambda name: lambda setting, study, study_dir: Flaky())
    messages = []
    tracker = Guarded("flaky", None, None, Path("."), messages.append)
    assert not tracker.call("log", "k", [(1, {"loss": 1.0})])
    assert not tracker.call("log", "k", [(2, {"loss": 1.0})])
    assert messages == ["tracking: flaky at nowhere failed: OSError: disk full; the study goes on without it"]


# ----- through `rayb run` -------------------------------------------------------------------------------


@pytest.mark.ray
def test_rayb_run_with_every_tracker(ray_session, tmp_path, monkeypatch):
    from rayb.cli import app

    mlruns = (tmp_path / "mlruns").as_uri()
    raw = tiny_study_dict(models=[{"arch": "gpt2", "config": {"d_model": 32, "n_layer": 2, "n_head": 2}}],
                          seeds=1, tracking={"tensorboard": True, "mlflow": mlruns, "wandb": {"project": "tiny"}})  # fmt: skip
    study_file = tmp_path / "tiny.yaml"
    study_file.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))  # this run's W&B runs apart from the other tests'
    result = CliRunner().invoke(app, ["run", str(study_file), "--output", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "tracking:" not in result.output  # no tracker failed
    study = parse_study(raw)
    (study_dir,) = (tmp_path / "out" / "studies").iterdir()
    name = f"gpt2-lr{study.train.lr[0]:g}-seed0"

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(study_dir / "tensorboard" / name))
    events.Reload()
    assert len(events.Scalars("train/loss")) == study.steps
    assert [e.step for e in events.Scalars("val/loss")] == [8, 16, 24]

    client, parent, (child,) = _mlflow_runs(mlruns, study.name)
    assert {"report.md", "report.html"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert child.info.status == "FINISHED" and child.data.params["arch"] == "gpt2"
    assert len(client.get_metric_history(child.info.run_id, "train/loss")) == study.steps
    assert child.data.metrics["eval/lm/val_loss"] > 0

    _, history, summary = _wandb_run(tmp_path, name)
    assert len(history) == study.steps and summary["eval/lm/val_loss"] > 0
