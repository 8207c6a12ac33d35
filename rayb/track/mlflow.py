"""MLflow: the study as a parent run (its report attached once written), each trial as a child run with
its resolved model and training config as params, its metrics per step, and its final results."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path
from urllib.parse import urlparse

from rayb.track import TRACKERS, Tracker, TrialRun

PROBE_S = 5.0  # an unreachable server fails at once, not after MLflow's minutes of retries
_BATCH = {"metrics": 1000, "params": 100}  # MLflow's limits per log_batch call


class MlflowTracker(Tracker):
    def __init__(self, uri: str, study, study_dir: Path):
        uri = tracking_uri(uri)
        self.destination = f"mlflow at {uri}"
        if urlparse(uri).scheme in ("http", "https"):
            _probe(uri)
        if uri.startswith("file:"):
            # MLflow 3 refuses its file store unless asked; a study file naming one asks for it.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(study.name)
        self.experiment = (
            experiment.experiment_id if experiment else self.client.create_experiment(study.name)
        )
        fingerprint = study.fingerprint()
        self.parent = self.client.create_run(
            self.experiment, run_name=f"{study.name}-{fingerprint}",
            tags={"rayb.study": study.name, "rayb.fingerprint": fingerprint},
        ).info.run_id  # fmt: skip
        self._log(self.parent, params={
            "models": [m.label for m in study.models], "seeds": study.seeds, "eval": study.eval,
            "reference": study.reference, "fingerprint": fingerprint,
        })  # fmt: skip
        self.runs: dict[str, str] = {}  # trial key -> run id
        self.last_step: dict[str, int] = {}

    def start_trial(self, run: TrialRun) -> None:
        tags = {"mlflow.parentRunId": self.parent, "rayb.trial_key": run.key, "rayb.study": run.group}
        run_id = self.client.create_run(self.experiment, run_name=run.name, tags=tags).info.run_id
        self._log(run_id, params=run.params)
        self.runs[run.key], self.last_step[run.key] = run_id, 0

    def log(self, key: str, rows: list[tuple[int, dict[str, float]]]) -> None:
        self._log(self.runs[key], metrics=rows)
        self.last_step[key] = rows[-1][0]

    def finish_trial(self, key: str, results: dict[str, float], ok: bool) -> None:
        run_id, step = self.runs.pop(key), self.last_step.pop(key)
        self._log(run_id, metrics=[(step, results)])
        self.client.set_terminated(run_id, status="FINISHED" if ok else "FAILED")

    def finish_study(self, files: list[Path], ok: bool) -> None:
        for path in files:
            if path.is_file():
                self.client.log_artifact(self.parent, str(path))
        self.client.set_terminated(self.parent, status="FINISHED" if ok else "FAILED")
        self.parent = None

    def close(self) -> None:
        for run_id in [*self.runs.values(), *([self.parent] if self.parent else [])]:
            self.client.set_terminated(run_id, status="KILLED")
        self.runs.clear()

    def _log(self, run_id: str, params=None, metrics=None) -> None:
        from mlflow.entities import Metric, Param

        now = int(time.time() * 1000)
        params = [Param(_key(k), _value(v)) for k, v in (params or {}).items()]
        metrics = [Metric(_key(k), v, now, step) for step, values in metrics or [] for k, v in values.items()]
        for i in range(0, len(params), _BATCH["params"]):
            self.client.log_batch(run_id, params=params[i : i + _BATCH["params"]])
        for i in range(0, len(metrics), _BATCH["metrics"]):
            self.client.log_batch(run_id, metrics=metrics[i : i + _BATCH["metrics"]])


def tracking_uri(uri: str) -> str:
    """The URI MLflow's client is given: a directory (read from where rayb runs) as a file:// URI."""
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:", uri):
        return uri
    return Path(uri).expanduser().resolve().as_uri()


def _probe(uri: str) -> None:
    url = urlparse(uri)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=PROBE_S).close()
    except OSError as exc:
        raise ConnectionError(f"cannot reach {url.hostname}:{port} ({exc})") from None


def _key(name: str) -> str:
    # MLflow names hold letters, digits, _ - . / and spaces; suites such as lm_eval:hellaswag have a colon.
    return re.sub(r"[^\w\-./ ]", "_", name)


def _value(value) -> str:
    return (value if isinstance(value, str) else json.dumps(value))[:6000]  # MLflow's longest param value


@TRACKERS.decorator("mlflow")
def make(uri: str, study, study_dir: Path) -> MlflowTracker:
    return MlflowTracker(uri, study, study_dir)
