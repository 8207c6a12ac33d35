"""The driver's tracking thread: it tails every trial's files and forwards what is new to the trackers.

Trials write only their own files (metrics.jsonl while training, train_result.json at the end, one result
per eval suite); this thread reads them every few seconds, so trackers stay out of the training loop and
out of Ray's workers. Every tracker call is guarded: the first failure (a server that cannot be reached, a
full disk) warns once, and the study goes on without that tracker.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayb import storage
from rayb.eval.actors import read_result
from rayb.eval.registry import parse_suite
from rayb.files import read_json, write_json_atomic
from rayb.study import Study
from rayb.track import TRACKERS, Tracker, TrialRun
from rayb.train.loop import METRICS
from rayb.train.trial import TRAIN_DONE, TrialSpec

TRACKED = "tracked.json"  # in a trial dir: the trackers (by destination) that have its whole run
POLL_S = 2.0

# metrics.jsonl fields -> tracker metric names, by record kind
_NAMES = {
    "train": {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
              "tokens_per_s": "train/tokens_per_s"},
    "val": {"val_loss": "val/loss"},
    "epoch": {"val_loss": "epoch/val_loss", "epoch": "epoch/epoch"},
}  # fmt: skip
_RESULTS = ("final_train_loss", "params_total", "params_non_embedding", "train_tokens", "train_flops",
            "wall_s", "tokens_per_s", "steps")  # fmt: skip


class Guarded:
    """A tracker whose first failure warns once and switches it off."""

    def __init__(self, name: str, setting: Any, study: Study, study_dir: Path, log):
        # Until the tracker exists (and names its destination itself), what the study file says.
        self.destination = f"{name} at {setting}" if isinstance(setting, str) else name
        self.log = log
        self.tracker: Tracker | None = None
        try:
            self.tracker = TRACKERS.get(name)(setting, study, study_dir)
            self.destination = self.tracker.destination
        except Exception as exc:  # noqa: BLE001  (a tracker must never fail the study)
            self._warn(exc)

    @property
    def on(self) -> bool:
        return self.tracker is not None

    def call(self, method: str, *args: Any) -> bool:
        """Call the tracker's `method`; False if it is off or has just failed (and is now off)."""
        if self.tracker is None:
            return False
        try:
            getattr(self.tracker, method)(*args)
            return True
        except Exception as exc:  # noqa: BLE001  (a tracker must never fail the study)
            # Not closed: closing a tracker whose server is gone would wait on that server again.
            self.tracker = None
            self._warn(exc)
            return False

    def _warn(self, exc: Exception) -> None:
        self.log(
            f"tracking: {self.destination} failed: {type(exc).__name__}: {exc}; the study goes on without it"
        )


@dataclass
class _Trial:
    """What has been forwarded of one trial."""

    spec: TrialSpec
    trackers: list[Guarded]  # those that log this trial's run
    offset: int = 0  # bytes of metrics.jsonl read
    last: dict[str, int] = field(default_factory=dict)  # {record kind: last step forwarded}


class Tracking:
    """Forwards a study's trials to its trackers from a thread; `finish_study` ends the study-level run."""

    def __init__(
        self, study: Study, trials: list[TrialSpec], study_dir: Path, log, poll_s: float = POLL_S, sync=None
    ):
        self.study, self.trials, self.study_dir, self.log, self.poll_s = study, trials, study_dir, log, poll_s
        # Called once a trial's runs end: copies the trackers' files (in study_dir) to where the study
        # lives, so a study on object storage does not keep them on the driver's disk until it ends.
        self.sync = sync
        self.trackers: list[Guarded] = []
        self.open: dict[str, _Trial] = {}  # trial key -> its runs, while not finished
        self.seen: set[str] = set()  # trial keys started (or found tracked by an earlier run)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="rayb-tracking", daemon=True)

    def start(self) -> None:
        # The trackers (and their libraries' imports) are made here, on the caller's thread: a library
        # imported in a thread while the main thread imports Ray's modules can meet a
        # half-imported module (seen with mlflow.tracking).
        self.trackers = [
            Guarded(name, getattr(self.study.tracking, name), self.study, self.study_dir, self.log)
            for name in self.study.tracking.enabled
        ]
        if self.trackers:
            self._thread.start()

    def stop(self) -> None:
        """Forward what is left, and end every trial's run (trials that never finished as failed)."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()

    def finish_study(self, files: list[Path] | None) -> None:
        """Attach the study's report (None: the study failed after training) and release the trackers."""
        for tracker in self.trackers:
            tracker.call("finish_study", [Path(f) for f in files or []], files is not None)
            tracker.call("close")

    def _serve(self) -> None:
        try:
            while not self._stop.wait(self.poll_s):
                self.poll()
            self.poll(final=True)
        except Exception as exc:  # noqa: BLE001  (reading the trials' files failed: training goes on)
            self.log(f"tracking stopped: {type(exc).__name__}: {exc}; the study goes on without it")

    def poll(self, final: bool = False) -> None:
        """Forward every trial's new metrics; end the runs of trials whose training and evaluation are
        over (all of them, `final`ly)."""
        for spec in self.trials:
            if spec.key in self.seen and spec.key not in self.open:
                continue
            trial = self.open.get(spec.key) or self._begin(spec)
            if trial is None:
                continue
            # Read first: a trial writes its last metrics before train_result.json, so once it is settled,
            # this forward reads its whole log.
            results, ok, settled = trial_results(self.study, spec)
            self._forward(trial)
            if settled or final:
                for tracker in trial.trackers:
                    if tracker.call("finish_trial", spec.key, results, ok) and settled:
                        _mark_tracked(spec, tracker.destination)
                del self.open[spec.key]
                self._sync()

    def _sync(self) -> None:
        if self.sync is None:
            return
        try:
            self.sync()
        except OSError as exc:  # the store unreachable for now: the files go up again with the next trial
            self.log(f"could not copy the trackers' files to the study directory yet: {exc}")

    def _begin(self, spec: TrialSpec) -> _Trial | None:
        trial_dir = spec.trial_dir
        if not any(storage.exists(storage.join(trial_dir, name)) for name in (METRICS, TRAIN_DONE)):
            return None  # not started yet
        self.seen.add(spec.key)
        tracked = read_json(storage.join(trial_dir, TRACKED)).get("destinations", [])
        run = TrialRun(spec.key, run_name(spec), self.study.name, trial_params(spec))
        trackers = [t for t in self.trackers if t.on and t.destination not in tracked]
        trial = _Trial(spec, [t for t in trackers if t.call("start_trial", run)])
        if trial.trackers:
            self.open[spec.key] = trial
            return trial
        return None

    def _forward(self, trial: _Trial) -> None:
        records, trial.offset = _read_new(storage.join(trial.spec.trial_dir, METRICS), trial.offset)
        rows: list[tuple[int, dict[str, float]]] = []
        for record in records:
            kind, step = record.get("kind"), record.get("step")
            if kind not in _NAMES or not isinstance(step, int) or step <= trial.last.get(kind, 0):
                continue  # a step logged again after a resume keeps what was forwarded first
            trial.last[kind] = step
            metrics = record_metrics(record)
            if rows and rows[-1][0] == step:  # validation at the step just trained: one row
                rows[-1][1].update(metrics)
            else:
                rows.append((step, metrics))
        if rows:
            for tracker in trial.trackers:
                tracker.call("log", trial.spec.key, rows)


@contextmanager
def tracking(study: Study, trials: list[TrialSpec], study_dir: Path, log, sync=None) -> Iterator[Tracking]:
    """Track the trials while the body trains and evaluates them; call `finish_study` once reported."""
    tracked = Tracking(study, trials, study_dir, log, sync=sync)
    tracked.start()
    try:
        yield tracked
    finally:
        tracked.stop()


def run_name(spec: TrialSpec) -> str:
    return f"{spec.model}-lr{spec.lr:g}-seed{spec.seed}"


def trial_params(spec: TrialSpec) -> dict[str, Any]:
    """A trial's parameters, flat: what it is, its resolved model config and its training config."""
    return {
        "model": spec.model, "arch": spec.arch, "lr": spec.lr, "seed": spec.seed, "steps": spec.steps,
        "trial_key": spec.key, **_flat("model_config", spec.model_config),
        **_flat("train", spec.train.model_dump(mode="json")),
    }  # fmt: skip


def record_metrics(record: dict[str, Any]) -> dict[str, float]:
    """One metrics.jsonl record as tracker metrics; a model's own metrics (`extra`) keep their names."""
    kind = record["kind"]
    named = {_NAMES[kind][k]: v for k, v in record.items() if k in _NAMES[kind]}
    prefix = "train" if kind == "train" else kind
    extra = {k.removeprefix("extra."): v for k, v in record.items() if k.startswith("extra.")}
    extra |= record.get("extra") or {}
    return _numbers(named | {f"{prefix}/{k}": v for k, v in extra.items()})


def trial_results(study: Study, spec: TrialSpec) -> tuple[dict[str, float], bool, bool]:
    """(final results, trained ok, settled): settled once training is over and every suite has a result
    (or training failed, so nothing will be evaluated)."""
    trial_dir = spec.trial_dir
    train = read_json(storage.join(trial_dir, TRAIN_DONE))
    if not train:
        return {}, False, False
    ok = train.get("status") == "ok"
    results = _numbers({f"result/{k}": train.get(k) for k in _RESULTS})
    settled = True
    for suite in study.eval if ok else []:
        benchmark, _ = parse_suite(suite)
        result = read_result(trial_dir, suite, study.eval_options.get(benchmark.name, {}))
        settled &= result.get("status") is not None
        if result.get("status") == "ok":
            results |= _numbers(_flat(f"eval/{suite}", result["metrics"], sep="/"))
    return results, ok, settled


def _read_new(location: str, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The whole lines appended to a log since `offset` (a line being written waits for the next read)."""
    if storage.is_remote(location):  # an object is read whole (pushed every few seconds)
        data = (storage.read_bytes(location) or b"")[offset:]
    elif not Path(location).exists():
        return [], offset
    else:
        with Path(location).open("rb") as f:
            f.seek(offset)
            data = f.read()
    end = data.rfind(b"\n") + 1
    records = []
    for line in data[:end].splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a crash
            continue
    return records, offset + end


def _mark_tracked(spec: TrialSpec, destination: str) -> None:
    """Remember that `destination` has this trial's whole run, so a rerun of the study does not log it twice."""
    path = storage.join(spec.trial_dir, TRACKED)
    destinations = read_json(path).get("destinations", [])
    write_json_atomic(path, {"destinations": sorted({*destinations, destination})})


def _flat(prefix: str, value: Any, sep: str = ".") -> dict[str, Any]:
    if isinstance(value, dict):
        return {
            k: v for key, item in value.items() for k, v in _flat(f"{prefix}{sep}{key}", item, sep).items()
        }
    return {prefix: value}


def _numbers(values: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
