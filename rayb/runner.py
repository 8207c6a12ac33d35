"""A study, end to end: data → trials (Ray Train + DeepSpeed) → eval actors → results → verdict.

Every step reads and writes hash-keyed paths under the output directory (a local directory, or a URI on
object storage: rayb/storage.py):
    cache/data/<data key>/            packed tokens + tokenizer (shared by studies with equal data)
    trials/<model>-<trial key>/       metrics.jsonl, train_result.json, model/, eval/<suite>-<hash>.json
    studies/<name>-<study hash>/      results.parquet, provenance.json, report.md/.html, results.json, *.png
so a rerun (after a crash, or with one more model or seed) does only the work that is missing.
"""

from __future__ import annotations

import json
import math
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from rayb import lock, pinned, storage
from rayb.archive import archive
from rayb.data.cache import TokenCache
from rayb.eval.actors import DrainedWorkers, EvalPool, read_result
from rayb.eval.feed import FinishedTrials, evaluating_beside
from rayb.eval.registry import PRIMARY_SUITE, parse_suite
from rayb.files import read_json, write_json_atomic
from rayb.lock import study_lock, trial_claims
from rayb.models.pretrained import Checkpoint, hub_checkpoint
from rayb.models.spec import PRETRAINED_ARCH, CheckpointRef
from rayb.results import RESULTS_NAME, ResultRow, write_results
from rayb.stages import TIMINGS, Stages
from rayb.study import (
    RAY_LOG,
    Study,
    StudyError,
    StudyFailed,
    load_study,
    study_directory,
)
from rayb.track.driver import tracking
from rayb.train.loop import METRICS
from rayb.train.trial import TRAIN_DONE, TrialSpec, read_metrics
from rayb.tune.packs import groups_at_once, trial_slots, unfittable, worker_pool


@dataclass
class StudyOutcome:
    study_dir: Path
    table: pd.DataFrame
    report: Any  # rayb.report.study_report.StudyReport
    files: dict[str, Path]
    trained: int  # trials trained (or resumed) by this run
    evaluated: int  # (checkpoint × suite) evaluations run by this run
    wall_s: float
    errors: dict[str, str] = field(default_factory=dict)  # trial key -> why it failed
    trials: list[TrialSpec] = field(default_factory=list)
    eval_errors: dict[str, str] = field(default_factory=dict)  # "trial key × suite" -> why it failed
    archive_error: str | None = None  # why the copy to --archive failed (the results are all in place)


def plan_trials(
    study: Study,
    cache: TokenCache,
    out: Path | str,
    checkpoints: dict[str, dict[int, Checkpoint]] | None = None,
) -> list[TrialSpec]:
    """Every (model, lr, seed) trial; a pretrained model is one trial, evaluated and never trained."""
    checkpoints = checkpoints or {}
    vocab, data_key = cache.manifest["vocab_size"], cache.manifest["key"]
    trials = []

    def trial(model, key, **fields) -> TrialSpec:
        return TrialSpec(
            key=key, model=model.label, train=study.train, cache_dir=str(cache.path),
            trial_dir=storage.join(out, "trials", f"{model.label}-{key}"), storage_path=storage.join(out, "ray", "train"),
            **fields,
        )  # fmt: skip

    for i, model in enumerate(study.models):
        if model.pretrained:
            seed = study.seeds[0]
            checkpoint = checkpoints[model.pretrained][seed]
            key = study.trial_key(model, 0.0, seed, data_key, checkpoint.key)
            trials.append(trial(model, key, arch=PRETRAINED_ARCH, model_config={"checkpoint": checkpoint.to_dict()},
                                lr=0.0, seed=seed, steps=0))  # fmt: skip
            continue
        try:
            config, cost, steps = study.model_steps(model, vocab)
        except ValueError as exc:  # a size only checkable now that the tokenizer is known
            raise StudyError(f"models.{i}: {exc}") from None
        for lr in study.train.lr:
            for seed in study.seeds:
                init = checkpoints[model.init_from][seed] if model.init_from else None
                key = study.trial_key(model, lr, seed, data_key, init.key if init else None, config)
                trials.append(trial(model, key, arch=model.architecture, model_config=config, lr=lr, seed=seed,
                                    steps=steps, train_flops_per_token=cost.train_flops_per_token,
                                    init_from=init.to_dict() if init else None))  # fmt: skip
    return trials


def resolve_checkpoints(study: Study, out: Path | str, log) -> dict[str, dict[int, Checkpoint]]:
    """{source: {seed: checkpoint}} for every checkpoint the study's models name. A `study:FILE#MODEL`
    reference runs that study first (skipping whatever it has finished) and points each seed at MODEL's
    final weights of the same seed there (its first seed where it has no such seed), so a finetuning
    arm's seeds differ in their starting weights as a from-scratch model's differ in initialisation."""
    refs = {ref.source: ref for m in study.models if (ref := m.checkpoint) is not None}
    return {source: _resolve_checkpoint(refs[source], study.seeds, out, log) for source in sorted(refs)}


def _resolve_checkpoint(ref: CheckpointRef, seeds: list[int], out: Path | str, log) -> dict[int, Checkpoint]:
    if ref.kind != "study":
        return dict.fromkeys(seeds, hub_checkpoint(ref.source, ref.location))
    sub = load_study(ref.location)
    log(f"{ref.source}: running study {sub.name} first (finished work is skipped)")
    outcome = run_study(sub, out, log=lambda msg: log(f"[{sub.name}] {msg}"))
    table = outcome.table
    done = table[(table.model == ref.model) & (table.status == "ok")]
    resolved = {}
    for seed in seeds:
        rows = done[done.seed == (seed if seed in sub.seeds else sub.seeds[0])]
        if rows.empty:
            raise StudyError(f"{ref.source}: {ref.model} did not finish training in study {sub.name}")
        key = rows.sort_values("val_loss").trial_key.iloc[0]  # the best learning rate's weights
        chosen = next(t for t in outcome.trials if t.key == key)
        cache = TokenCache(chosen.cache_dir)
        resolved[seed] = Checkpoint(
            ref.source, model=storage.join(chosen.trial_dir, "model"),
            tokenizer=storage.join(chosen.cache_dir, "tokenizer"), key=key, arch=chosen.arch,
            config=chosen.model_config, vocab_size=cache.manifest["vocab_size"], seq_len=cache.seq_len,
        )  # fmt: skip
    return resolved


def check_init_tokenizers(
    study: Study, cache: TokenCache, checkpoints: dict[str, dict[int, Checkpoint]]
) -> None:
    """A finetuning arm must read the same token ids its starting weights were trained on."""
    from rayb.data.tokenizer import load_tokenizer

    ours = load_tokenizer(cache.tokenizer_dir).get_vocab()
    for source in sorted({m.init_from for m in study.models} - {None}):
        try:
            theirs = load_tokenizer(checkpoints[source][study.seeds[0]].tokenizer_files).get_vocab()
        except OSError as exc:
            raise StudyError(f"init_from '{source}': cannot load its tokenizer: {exc}") from None
        if theirs != ours:
            raise StudyError(
                f"init_from '{source}' was trained with another tokenizer ({len(theirs):,} tokens) than this "
                f"study's ({len(ours):,}); set data.tokenizer to the checkpoint's tokenizer"
            )


def materialise_pretrained(trial: TrialSpec) -> str | None:
    """Record a pretrained reference as 'trained' (its parameter count, no training); the error if its
    checkpoint cannot be found (the hub unreachable), which leaves the rest of the study to run."""
    from rayb.models.pretrained import count_checkpoint_params

    checkpoint = Checkpoint(**trial.model_config["checkpoint"])
    try:
        total, non_embedding = count_checkpoint_params(checkpoint)
    except (OSError, ValueError) as exc:
        return (
            f"pretrained '{checkpoint.source}': {exc}. Run `rayb data prepare` where the hub is reachable, "
            "or give a local save_pretrained directory"
        )
    write_json_atomic(
        storage.join(trial.trial_dir, TRAIN_DONE),
        {"status": "ok", "pretrained": checkpoint.source, "steps": 0, "params_total": total,
         "params_non_embedding": non_embedding, "train_tokens": 0, "train_flops": math.nan},
    )  # fmt: skip
    return None


def run_study(
    study: Study,
    output: Path | str | None = None,
    log=print,
    archive_uri: str | None = None,
    eval_only: bool = False,
    ray_logs: bool = True,
    dashboard: bool = False,
) -> StudyOutcome:
    """Run `study` (or, with `eval_only`, only evaluate its already-trained checkpoints) and report it;
    without `ray_logs`, Ray's own output goes to files (RAY_LOG in the study directory, and Ray's session
    logs) rather than the terminal; with `dashboard`, a local Ray runs its dashboard. Raises StudyError for
    a study that cannot run or be judged; whatever finished stays on disk."""
    from rayb import runtime
    from rayb.data.pipeline import prepare_data
    from rayb.models import selfcheck
    from rayb.report import import_in_background as import_report_libraries
    from rayb.report.provenance import PROVENANCE_NAME, collect
    from rayb.report.status import write_trials
    from rayb.train.trainer import start_train_services
    from rayb.tune.sweep import queue_name, run_pool, start_first_group_ahead

    began = time.perf_counter()
    out = storage.resolve(output or study.output_dir)
    study_dir = study_directory(study, output)
    # What libraries write for the study (its report, figures, trackers' files, Ray's driver log): the
    # study directory itself, or on object storage a local directory pushed to it as each trial's tracked
    # runs end and as the run ends.
    study_local = storage.writable(study_dir)
    study_local.mkdir(parents=True, exist_ok=True)
    with study_lock(study_dir):  # a second run of this study refuses, naming this one
        stages = Stages()
        imports = (
            selfcheck.import_in_background() if study.trained_models and not study.train.use_gpu else None
        )
        if url := runtime.init_ray(None if ray_logs else study_local / RAY_LOG, dashboard):
            log(f"Ray's dashboard: http://{url}")
        trains = study.trained_models and not eval_only
        cores, capacity = runtime.compute_cores(study.train.use_gpu), runtime.capacity()
        unfit = unfittable(study.train, capacity) if trains else None
        if trains and not unfit:  # a trial that can never start starts no process either
            start_first_group_ahead(study.train, trials_left=lambda: _may_train(study, out))
        if imports:
            imports.join()
        if unfit:
            raise StudyError(f"train: {unfit}")
        if not ray_logs:
            log(
                f"Ray's own logs: {study_local / RAY_LOG} (driver) and {runtime.session_logs()} (workers); -v shows them here"
            )
        # On rayb's private instance no autoscaler serves the groups (trainer.UnservedScalingPolicy).
        if trains and not runtime.private_instance():
            start_train_services()
        stages.end("ray_start")
        log("preparing data (tokenize, pack, mix) ...")
        cache = prepare_data(study.data, storage.join(out, "cache"), progress=log)
        stages.end("data")
        if study.data.vocab_size is not None and study.data.vocab_size != cache.manifest["vocab_size"]:
            raise StudyError(
                f"data.vocab_size is {study.data.vocab_size}, but tokenizer '{study.data.tokenizer}' has "
                f"{cache.manifest['vocab_size']} tokens; correct vocab_size"
            )
        check_task_fit(study, cache)
        provenance = collect(study, cache.manifest["unigram_entropy_nats"], runtime.cluster_summary())
        if differs := provenance["pinned"]["differs"]:
            log(pinned.summary({name: tuple(pair) for name, pair in differs.items()}))
        provenance["self_checks"] = self_checks(study, cache.manifest["vocab_size"], provenance, log)
        write_json_atomic(storage.join(study_dir, PROVENANCE_NAME), provenance)
        stages.end("self_checks")
        checkpoints = resolve_checkpoints(study, out, log)
        check_init_tokenizers(study, cache, checkpoints)
        trials = plan_trials(study, cache, out, checkpoints)
        errors = {}
        for trial in trials:
            if trial.arch == PRETRAINED_ARCH and not trial.done and (error := materialise_pretrained(trial)):
                errors[trial.key] = error
        wanted = trials if study.seed_rounds is None else adaptive_wanted(study, trials)
        write_trials(study_dir, wanted)
        pending = [t for t in wanted if not t.done and t.arch != PRETRAINED_ARCH]
        if eval_only and pending:
            names = ", ".join(storage.name(t.trial_dir) for t in pending[:3]) + (
                " ..." if len(pending) > 3 else ""
            )
            raise StudyError(
                f"--eval-only: {len(pending)} of {len(wanted)} trials have no finished training ({names}); "
                "nothing was trained. Drop --eval-only to train them, or check the study matches the one trained."
            )
        if pending and study.train.use_gpu and not study.train.allow_slow_kernels:
            check_kernels(sorted({t.arch for t in pending}))
        slots = trial_slots(study.train, capacity)
        log(
            f"{len(wanted)} trials, {len(wanted) - len(pending)} already trained; training {len(pending)}"
            + (" in rounds of seeds" if study.seed_rounds else "")
            + ", evaluating each as it finishes ..."
        )
        feed = FinishedTrials(study, trials, capacity)
        feed.pool_ahead = bool(pending)
        evaluations = EvalPool(max(1, cores), study.train.use_gpu, log=log, spare_cpus=feed.spare_cpus,
                               poll_s=EvalPool.poll_for(out), drained=lambda: feed.workers,
                               free_cores=feed.free_cores)  # fmt: skip
        stages.end("planning")
        trained, groups, report_imports = 0, 0, None

        def train(trials_to_train: list[TrialSpec]) -> None:
            """Train on a worker pool of their own: a study in rounds of seeds starts one per round, since
            each round's decision waits on evaluations that need what the groups would hold."""
            nonlocal trained, groups, report_imports
            to_train = [t for t in trials_to_train if t.arch != PRETRAINED_ARCH]
            at_once = groups_at_once(to_train, slots, capacity, study.data.seq_len)
            if not (pool := worker_pool(to_train, at_once, cores)):
                return
            report_imports = report_imports or import_report_libraries()
            trained += len({t.key for g in pool for t in g.trials})
            at_once = min(at_once, len(pool))
            groups = max(groups, at_once)
            feed.pool, feed.slots, name = pool, at_once, queue_name()
            feed.workers = None if study.train.use_gpu else DrainedWorkers(name)
            feed.pool_ahead = False
            try:
                errors.update(run_pool(pool, at_once, study_dir, name))
            finally:
                feed.workers = None

        with (
            tracking(study, trials, study_local, log, sync=_pusher(study_dir)) as tracked,
            evaluating_beside(evaluations, feed) as evaluated,
        ):
            while pending := _untrained(wanted, errors):
                if study.seed_rounds is not None:
                    log(f"a round of seeds: training up to {_seed_counts(wanted)} seeds per model")
                train_claimed(pending, out, study.name, train, log)
                if report_imports:  # before anything here imports what it imports
                    report_imports.join()
                if study.seed_rounds is None:
                    break
                await_held_out_loss(study, wanted, evaluated)
                wanted = adaptive_wanted(study, trials)
                write_trials(study_dir, wanted)
            stages.end("training")
        stages.end("evaluation_after_training")
        try:
            if "failure" in evaluated:
                raise evaluated["failure"]
            outcome = _report(study, wanted, errors, evaluated["errors"], study_dir, provenance)
            tracked.finish_study(list(outcome.files.values()))
            stages.end("report")
            write_json_atomic(storage.join(study_dir, TIMINGS), stages.seconds | {"groups_at_once": groups})
        except Exception as exc:  # after training: every finished trial, evaluation and result stays on disk
            tracked.finish_study(None)
            raise _after_training_error(exc, study_dir) from exc
        finally:  # on object storage: the report, logs and tracker files join the rest, the table last
            storage.push(study_dir, last=(RESULTS_NAME,), keep=True)
        outcome.evaluated = evaluations.submitted
        outcome.archive_error = _archive(out, study_local, wanted, archive_uri, log) if archive_uri else None
        outcome.trained, outcome.wall_s = trained, time.perf_counter() - began
        return outcome


def _may_train(study: Study, out: Path | str) -> bool:
    """Whether the study may have trials to train, told before its data is prepared and its trials planned
    (their keys name its token cache): `out` holds fewer finished trials than it has trained ones. Trials
    that other studies finished there can make it say no where trials are left: their workers then start
    with the pool, as they would without this."""
    wanted = len(study.trained_models) * len(study.train.lr) * len(study.seeds)
    trials, finished = storage.join(out, "trials"), 0
    for name in storage.listdir(trials):
        finished += storage.exists(storage.join(trials, name, TRAIN_DONE))
        if finished >= wanted:
            return False
    return wanted > 0


def _pusher(study_dir: str):
    """On object storage: what copies the study directory's local files (trackers', logs) to the store."""
    return (lambda: storage.push(study_dir, keep=True)) if storage.is_remote(study_dir) else None


def _untrained(trials: list[TrialSpec], failed: dict[str, str]) -> list[TrialSpec]:
    """The trials still to train: not finished, not a pretrained reference, and not failed in this run."""
    return [t for t in trials if t.arch != PRETRAINED_ARCH and t.key not in failed and not t.done]


def train_claimed(
    trials: list[TrialSpec], output: str, study_name: str, train: Callable[[list[TrialSpec]], None], log
) -> None:
    """Train `trials` under this run's claims on them. One that another run (of another study sharing it)
    is training is left to it: this run waits for it to finish, and trains it itself if that run lets it
    go unfinished (it ended or was killed). Each trial is trained by this run at most once."""
    tried: set[str] = set()
    said: set[str] = set()
    while pending := [t for t in trials if t.key not in tried and not t.done]:
        with trial_claims(output, [t.key for t in pending], study_name) as elsewhere:
            if mine := [t for t in pending if t.key not in elsewhere]:
                train(mine)
                tried.update(t.key for t in mine)
        if not elsewhere:
            return
        if set(elsewhere) != said:
            studies = sorted({holder.get("study", "?") for holder in elsewhere.values()})
            log(
                f"waiting for {len(elsewhere)} trial(s) that another run is training (study {', '.join(studies)})"
            )
            said = set(elsewhere)
        time.sleep(lock.WAIT_S)


def adaptive_wanted(study: Study, trials: list[TrialSpec]) -> list[TrialSpec]:
    """With adaptive seeds, the trials the study wants once its next round is trained, from the held-out
    losses so far (rayb/analysis/sequential.py): round one runs `min` seeds of every model at every lr;
    each later round adds a seed, at the lr selected on round one, to the models still undecided."""
    from rayb.analysis.sequential import seed_values, seeds_to_run
    from rayb.analysis.verdict import selected_rows
    from rayb.results import results_frame

    column = study.verdict.gate.metrics[study.verdict.gate.loss_metric].column
    first = [
        t for t in trials if study.seeds.index(t.seed) < study.seed_rounds.min or t.arch == PRETRAINED_ARCH
    ]
    run = [t for t in trials if t.done]
    table = results_frame(result_rows(study, run, {})) if run else None
    if table is None or not (table.status == "ok").any():
        return first
    selected = selected_rows(table)
    lrs = {str(m): float(rows.lr.iloc[0]) for m, rows in selected.groupby("model")}
    values = {m.label: [] for m in study.trained_models} | seed_values(selected, column)
    counts = seeds_to_run(values, study.reference, study.significance.rounds)
    later = [
        t for t in trials
        if t not in first and t.lr == lrs.get(t.model) and study.seeds.index(t.seed) < counts.get(t.model, 0)
    ]  # fmt: skip
    return first + later


def await_held_out_loss(study: Study, trials: list[TrialSpec], evaluated: dict[str, Any]) -> None:
    """Wait until every trial that trained has its held-out loss evaluated (the eval pool serves that
    suite first): the next round of seeds is decided on it."""
    options = study.eval_options.get(PRIMARY_SUITE, {})
    while "failure" not in evaluated:
        ok = [t for t in trials if read_json(storage.join(t.trial_dir, TRAIN_DONE)).get("status") == "ok"]
        if all(read_result(t.trial_dir, PRIMARY_SUITE, options).get("status") for t in ok):
            return
        time.sleep(0.5)
    raise evaluated["failure"]


def _seed_counts(trials: list[TrialSpec]) -> str:
    counts: dict[str, set[int]] = {}
    for t in trials:
        counts.setdefault(t.model, set()).add(t.seed)
    return ", ".join(f"{model} {len(seeds)}" for model, seeds in counts.items())


def self_checks(study: Study, vocab_size: int, provenance: dict[str, Any], log) -> list[dict[str, Any]]:
    """models/selfcheck.py's checks of every trained model, where its trials will run (a GPU worker for a
    GPU study). A failure the study file does not override stops the study before anything trains; an
    overridden one is logged, and the report marks the scores it affects."""
    from rayb.models import selfcheck
    from rayb.train.trainer import gpu_self_checks

    check = gpu_self_checks if study.train.use_gpu else None
    results = selfcheck.check_study(study, vocab_size, selfcheck.study_dtypes(study), check)
    if reason := selfcheck.stop_reason(study, results, provenance["versions"]):
        raise StudyError(reason)
    for result in results:
        if result.failed:
            log(f"self-check failed, overridden by the study file: {result.describe()}")
    return selfcheck.records(results)


def check_task_fit(study: Study, cache) -> None:
    """rayb's recall tasks must fit the study's context with the facts they ask about: stop before any
    training rather than score truncated text."""
    if not any(suite.startswith("lm_eval:rayb_") for suite in study.eval):
        return  # lm-eval is imported only for a study that runs it
    from rayb.data.tokenizer import load_tokenizer
    from rayb.eval.harness import study_task_problems

    tokenizer = load_tokenizer(cache.tokenizer_dir)
    if problems := study_task_problems(
        study.eval, study.eval_options.get("lm_eval"), tokenizer, cache.seq_len
    ):
        raise StudyError("; ".join(problems))


def check_kernels(archs: list[str]) -> None:
    """A GPU study stops before training where an architecture would run a slow fallback kernel."""
    from rayb.models.kernels import slow_kernels_message
    from rayb.train.trainer import probe_kernels

    if message := slow_kernels_message(probe_kernels(archs)):
        raise StudyError(message)


def _report(study, trials, errors, eval_errors, study_dir, provenance) -> StudyOutcome:
    from rayb.report.study_report import build_report, write_report

    local = storage.writable(study_dir)
    table = write_results(result_rows(study, trials, errors), local / RESULTS_NAME)
    report = build_report(table, provenance)
    files = write_report(report, local) | {"table": local / RESULTS_NAME}
    return StudyOutcome(
        study_dir, table, report, files, trained=0, evaluated=0, wall_s=0.0, errors=errors, trials=trials,
        eval_errors={f"{key} × {suite}": error for (key, suite), error in eval_errors.items()},
    )  # fmt: skip


ERROR_LOG = "error.txt"


def _after_training_error(exc: Exception, study_dir: str) -> StudyFailed:
    """A failure once training is over, as a study error: its message, where its traceback was written,
    and that the finished work is kept (a rerun redoes none of it)."""
    error_log = storage.join(study_dir, ERROR_LOG)
    storage.write_bytes(error_log, "".join(traceback.format_exception(exc)).encode())
    table = storage.writable(study_dir) / RESULTS_NAME
    return StudyFailed(
        f"{type(exc).__name__}: {exc}. Every trained model and finished evaluation is kept"
        + (f", and the results table is at {storage.join(study_dir, RESULTS_NAME)}" if table.exists() else "")
        + f"; the traceback is in {error_log}. Fix the cause and run again: nothing finished is redone."
    )


def _archive(out: str, study_dir: Path, trials: list[TrialSpec], uri: str, log) -> str | None:
    """Copy the study's results to `uri`; the error, if that failed. It runs last, so a failure loses
    nothing: every result is in `out`, and running the study again retries only the copy."""
    if storage.is_remote(out):
        log(f"not archived to {uri}: the output is on object storage already ({out})")
        return None
    dirs = [study_dir, *(Path(t.trial_dir) for t in trials if Path(t.trial_dir).exists())]
    try:
        copy = archive(Path(out), dirs, uri)
    except (OSError, ValueError) as exc:
        return f"could not archive to {uri}: {exc}"
    log(f"archived to {copy.uri}: {copy.copied} files copied, {copy.unchanged} already there")
    return None


def result_rows(study: Study, trials: list[TrialSpec], errors: dict[str, str]) -> list[ResultRow]:
    """One row per trial, built from the trials' own files (so it can be rebuilt at any time)."""
    return [_row(study, t, errors.get(t.key)) for t in trials]


def _eval_columns(study: Study, trial_dir: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Each suite's metrics as `<suite>.<metric>` columns (the held-out `lm` suite's as val_*), its
    version as `<suite>.version`; and {suite: error} for the suites that failed or have not run."""
    columns, errors = {}, {}
    for suite in study.eval:
        benchmark, _ = parse_suite(suite)
        result = read_result(trial_dir, suite, study.eval_options.get(benchmark.name, {}))
        if result.get("status") != "ok":
            errors[suite] = result.get("error", "not evaluated")
            continue
        metrics = dict(result["metrics"])
        if suite == PRIMARY_SUITE:  # the study's own held-out data: the primary metric of every comparison
            columns |= {f"extra.{name}": value for name, value in metrics.pop("extra", {}).items()}
            columns |= {name: metrics[name] for name in ("val_loss", "val_ppl", "val_bpb")}
        else:
            columns |= {f"{suite}.{name}": value for name, value in metrics.items()}
        columns[f"{suite}.version"] = result["version"]
    return columns, errors


def _row(study: Study, trial: TrialSpec, error: str | None) -> ResultRow:
    trial_dir = trial.trial_dir
    train = read_json(storage.join(trial_dir, TRAIN_DONE))
    evaluation, eval_errors = _eval_columns(study, trial_dir)
    log = read_metrics(storage.join(trial_dir, METRICS))
    curve, val_curve, epochs = ([r for r in log if r["kind"] == kind] for kind in ("train", "val", "epoch"))
    status = train.get("status", "error")
    if status == "ok" and PRIMARY_SUITE in eval_errors:
        status, error = "error", error or f"{PRIMARY_SUITE}: {eval_errors[PRIMARY_SUITE]}"
    core = {name: evaluation.pop(name) for name in ("val_loss", "val_ppl", "val_bpb") if name in evaluation}
    return ResultRow(
        study=study.name, model=trial.model, arch=trial.arch, lr=trial.lr, seed=trial.seed, trial_key=trial.key,
        status=status, error=error or "", pretrained=train.get("pretrained", ""),
        eval_errors=eval_errors if status == "ok" else {},
        params_total=train.get("params_total", 0), params_non_embedding=train.get("params_non_embedding", 0),
        train_tokens=train.get("train_tokens", 0), steps=train.get("steps", 0),
        train_flops=train.get("train_flops", math.nan), train_flops_per_token=trial.train_flops_per_token,
        final_train_loss=train.get("final_train_loss", math.nan), **core,
        wall_s=train.get("wall_s", math.nan), tokens_per_s=train.get("tokens_per_s", math.nan),
        checkpoint=storage.join(trial_dir, "model"), model_config=json.dumps(trial.model_config), train=trial.train,
        precision=train.get("precision", ""), kernels=train.get("kernels", {}),
        curve_step=[r["step"] for r in curve], curve_train_loss=[r["loss"] for r in curve],
        curve_val_step=[r["step"] for r in val_curve], curve_val_loss=[r["val_loss"] for r in val_curve],
        epoch_val_loss=[r["val_loss"] for r in epochs], epoch_extra=[r.get("extra", {}) for r in epochs],
        metrics=evaluation,
    )  # fmt: skip
