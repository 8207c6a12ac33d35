"""The `rayb` command: run and validate studies."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from rayb import storage
from rayb.cli_sizing import match, params
from rayb.study import StudyError, StudyFailed, check_output_dir, load_study
from rayb.terminal import console
from rayb.terminal import fail as _fail

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Fair architecture comparisons on Ray.")
# The model-sizing commands, in a module of their own.
app.command()(params)
app.command()(match)


def _load(path: Path):
    # Like `python -m`, make modules in the current directory importable (`arch: my_model:build`).
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return load_study(path)
    except StudyError as exc:
        console.print(f"[red]invalid study[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(code=2) from None


@app.command()
def validate(study_file: Path) -> None:
    """Check a study file; print every invalid field and what is allowed."""
    study = _load(study_file)
    console.print(
        f"[green]ok[/green] {study.name}: {_trial_count(study)}, {study.steps} steps of "
        f"{study.train.global_batch}×{study.data.seq_len} tokens"
        + (f" ({study.train.epochs} epochs)" if study.train.epochs > 1 else "")
    )
    console.print(f"  eval on every checkpoint: {', '.join(study.eval)}", highlight=False)
    for warning in _unmeasured_gate_metrics(study):
        console.print(f"  [yellow]{escape(warning)}[/yellow]", highlight=False)
    if study.data.nominal_vocab is None:
        console.print(
            "(model sizes are resolved once the hub tokenizer is fetched; data.vocab_size sizes them now)"
        )
        return
    from rayb.plan import PEAK_FLOPS, plan_study

    plan = plan_study(study, PEAK_FLOPS["a100"], 1.0)
    for model in plan.models:
        console.print(f"  {model.label}: {_model_line(model)}", highlight=False)
    for warning in _size_warnings(study, plan):
        console.print(f"  [yellow]{escape(warning)}[/yellow]", highlight=False)
    _self_checks(study, study.data.nominal_vocab)


def _self_checks(study, vocab_size: int) -> None:
    """models/selfcheck.py's checks here, on the CPU in fp32 (`rayb run` repeats them where the trials
    run: a GPU study's on a GPU worker, in its precision); a failure not overridden exits with code 2."""
    from rayb.models import selfcheck
    from rayb.report.provenance import versions

    results = selfcheck.check_study(study, vocab_size)
    where = " (on this CPU; `rayb run` checks again on a GPU worker)" if study.train.use_gpu else ""
    console.print(f"  self-checks{where}:", highlight=False)
    for result in results:
        colour = "red" if result.failed else "dim"
        console.print(f"    [{colour}]{escape(result.describe())}[/{colour}]", highlight=False)
    if reason := selfcheck.stop_reason(study, results, versions()):
        console.print(f"[red]{escape(reason)}[/red]", highlight=False)
        raise typer.Exit(code=2)


def _size_warnings(study, plan) -> list[str]:
    from rayb.analysis.comparability import Counted, size_warnings

    counts = {
        p.label: Counted(p.arch, p.config, p.params_total, p.params_non_embedding,
                         p.flops_per_trial / p.tokens_per_trial if p.tokens_per_trial else None)
        for p in plan.models
    }  # fmt: skip
    gate = study.verdict.gate
    return size_warnings(study.models, counts, study.reference, gate.candidates, study.train.flops_budget)


def _duration(hours: float) -> str:
    return f"{hours:,.1f} h" if hours >= 1 else f"{hours * 60:.0f} min"


def _trial_count(study) -> str:
    trained, references = len(study.trained_models), len(study.models) - len(study.trained_models)
    rounds = study.seed_rounds
    seeds = (
        f"{len(study.seeds)} seeds" if rounds is None else f"{rounds.min} to {rounds.max} seeds, in rounds"
    )
    count = (
        f"{trained} trained model{'s' if trained != 1 else ''} × {len(study.train.lr)} lr × {seeds} = "
        f"{'' if rounds is None else 'at most '}{trained * len(study.train.lr) * len(study.seeds)} trials"
    )
    return count + (f", and {references} pretrained references evaluated" if references else "")


def _model_line(model) -> str:
    if model.params_total is None:
        return f"pretrained, evaluated as it is ({model.arch})"
    return (
        f"{model.arch} {json.dumps(model.config)}, {model.params_total:,} parameters "
        f"({model.params_non_embedding:,} non-embedding), {model.steps} steps, "
        f"{model.flops_per_trial:.3g} training FLOPs"
    )


@app.command()
def plan(
    study_file: Path,
    gpu: Annotated[
        str, typer.Option("--gpu", help="a100, h100, h200, a10g or l4 (bf16 dense peak)")
    ] = "a100",
    mfu: Annotated[
        float | None,
        typer.Option("--mfu", help="price every model at this one MFU (default: each model's own, by size)"),
    ] = None,
    measured: Annotated[
        Path | None,
        typer.Option(
            "--measured",
            help="bench/gpu_check.py's MFU measurements, those of --gpu's GPU (default: "
            "~/.config/rayb/measured_mfu.json where it measured that GPU, else rayb's own)",
        ),
    ] = None,
    peak_tflops: Annotated[
        float | None, typer.Option("--peak-tflops", help="per-GPU peak instead of --gpu's")
    ] = None,
    gpus: Annotated[
        int, typer.Option("--gpus", min=1, help="GPUs in the cluster (default: one 8-GPU node)")
    ] = 8,
) -> None:
    """What a study would run: trials, how they pack onto the GPUs, training FLOPs and GPU-hours, each
    model at its MFU: measured by bench/gpu_check.py where it has been, a stated assumption otherwise."""
    from rayb.plan import PEAK_FLOPS, plan_study

    study = _load(study_file)
    if peak_tflops is None and gpu.lower() not in PEAK_FLOPS:
        _fail("--gpu", f"'{gpu}': use one of {', '.join(PEAK_FLOPS)}, or --peak-tflops")
    if mfu is not None and measured is not None:
        _fail("--mfu", "--mfu prices every model at one MFU; --measured prices each by size: pass one")
    peak = peak_tflops * 1e12 if peak_tflops else PEAK_FLOPS[gpu.lower()]
    source, measurements = _measurements(measured, gpu) if mfu is None else (None, [])
    try:
        result = plan_study(study, peak, mfu, measurements)
    except ValueError as exc:
        _fail("study", str(exc))
    table = Table(
        title=f"{study.name}: {study.data.seq_len}-token sequences, {study.train.global_batch} per step"
    )
    columns = ("model", "parameters", "trials", "steps", "tokens/trial", "FLOPs/trial", "MFU", "GPU-hours")
    for column in columns:
        table.add_column(column, justify="left" if column in ("model", "MFU") else "right")
    for m in result.models:
        if m.params_total is None:
            table.add_row(m.label, "pretrained", "eval only", "", "", "", "", "")
            continue
        table.add_row(m.label, f"{m.params_total:,}", str(m.trials), f"{m.steps:,}", f"{m.tokens_per_trial:,}",
                      f"{m.flops_per_trial:.3g}", m.mfu.describe(), f"{m.trials * result.trial_gpu_hours(m):,.1f}")  # fmt: skip
    console.print(table)
    share = result.gpus_per_trial
    packing = result.packing(gpus)
    groups = sum(packing.groups)
    at = f"{mfu:.0%} MFU" if mfu is not None else "each model's MFU"
    console.print(
        f"{_trial_count(study)}; {share or 'no'} GPU{'s' if share != 1 else ''} per trial"
        + ("" if study.train.use_gpu else " (train.use_gpu is false: the GPU-hours are what it would take on GPUs)")
        + f"\nOn {gpus} GPUs, {groups} worker group{'s' if groups != 1 else ''} take trials from "
        f"{len(packing.queues)} queue{'s' if len(packing.queues) != 1 else ''}: {packing.describe()}. A group "
        f"trains its queue's next trial as soon as it is free; {min(packing.slots, groups)} "
        f"group{'s' if packing.slots != 1 else ''} at once ({packing.slots} fit"
        + (f", {1 / share:g} to a GPU" if share and share < 1 else "") + ")."
        + f"\n{result.flops:.3g} training FLOPs: {result.gpu_hours:,.1f} GPU-hours at {at} of {peak / 1e12:,.0f} "
        f"TFLOP/s per GPU; about {_duration(result.wall_hours(gpus))} of wall-clock on {gpus} GPUs. "
        f"Evaluation ({len(study.eval)} suites per checkpoint) is not included.",
        highlight=False,
    )  # fmt: skip
    if mfu is None:
        from rayb.mfu import describe_sources

        for line in describe_sources(measurements, source, gpu.lower()):
            console.print(f"MFU {line}", highlight=False)
    from rayb.models.spec import STUDY_REF

    first = sorted(
        {ref["file"] for m in study.models if (ref := STUDY_REF.match(m.pretrained or m.init_from or ""))}
    )
    if first:
        console.print(
            f"It first runs {', '.join(first)} (not counted here): plan those too.", highlight=False
        )


def _measurements(path: Path | None, gpu: str) -> tuple[Path, list]:
    """(the measurements file, its MFU measurements of `gpu`), as `rayb.mfu.find_measurements` chooses."""
    from rayb.mfu import find_measurements

    try:
        return find_measurements(path, gpu)
    except (OSError, ValueError) as exc:
        _fail("--measured", str(exc))


def _unmeasured_gate_metrics(study) -> list[str]:
    """Gate metrics whose column no suite of the study produces: the gate will call them not measured."""
    from rayb.analysis.spec import GATE_CORE_COLUMNS

    suites = {suite.split(":", 1)[0] for suite in study.eval} | set(study.eval)
    return [
        f"gate metric {name} reads {rule.column}, which no eval suite of this study produces: "
        f"it will be reported as not measured (add `{rule.column.split('.', 1)[0]}` to eval)"
        for name, rule in study.verdict.gate.metrics.items()
        if rule.column not in GATE_CORE_COLUMNS and rule.column.split(".", 1)[0] not in suites
    ]


@app.command()
def run(
    study_file: Path,
    output: Annotated[
        str | None,
        typer.Option(
            "--output", "-o", help="output directory or s3://, gs://... URI (default: the study's output_dir)"
        ),
    ] = None,
    archive: Annotated[
        str | None,
        typer.Option("--archive", help="also copy the results to s3://, gs://, file://... (any pyarrow URI)"),
    ] = None,
    eval_only: Annotated[
        bool,
        typer.Option(
            "--eval-only", help="evaluate the trained checkpoints with the study's suites; never train"
        ),
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="show Ray's own logs here too (else they go to files)")
    ] = False,
    dashboard: Annotated[
        bool,
        typer.Option(
            "--dashboard",
            help="also start the local Ray's dashboard, on 127.0.0.1 (a cluster at RAY_ADDRESS has its own)",
        ),
    ] = False,
) -> None:
    """Run a study end to end on a local Ray, or on the cluster at RAY_ADDRESS."""
    study = _load(study_file)  # before Ray starts: bad input costs nothing
    if archive is not None:
        from rayb.archive import open_archive

        try:
            open_archive(archive)
        except ValueError as exc:
            _fail("--archive", str(exc))
    if output is not None:
        try:
            check_output_dir(output)
        except ValueError as exc:
            console.print(f"[red]invalid --output[/red] {escape(str(exc))}", highlight=False)
            raise typer.Exit(code=2) from None
    from rayb.report.progress import watching
    from rayb.runner import run_study, study_directory

    try:
        with watching(study_directory(study, output), console):
            outcome = run_study(
                study,
                output,
                log=lambda msg: console.print(f"[dim]rayb[/dim] {msg}", highlight=False),
                archive_uri=archive,
                eval_only=eval_only,
                ray_logs=verbose,
                dashboard=dashboard,
            )
    except StudyFailed as exc:  # after training: the results so far are kept
        console.print(f"[red]study failed[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(code=1) from None
    except StudyError as exc:  # found once the data is prepared (a hub tokenizer's size, --eval-only)
        _fail("study", str(exc))
    _print_verdict(outcome.report)
    for key, error in outcome.errors.items():
        console.print(f"[red]trial {key} failed[/red]: {escape(error)}", highlight=False)
    for job, error in outcome.eval_errors.items():  # recorded in the table; the others' results stand
        console.print(f"[yellow]evaluation {job} failed[/yellow]: {escape(error)}", highlight=False)
    console.print(
        f"trained {outcome.trained} trials, ran {outcome.evaluated} evaluations in {outcome.wall_s:.0f}s; "
        f"report: {outcome.files['report']}"
    )
    if outcome.archive_error:
        console.print(f"[red]{escape(outcome.archive_error)}[/red]", highlight=False)
    if outcome.errors or outcome.archive_error:
        raise typer.Exit(code=1)


def _print_verdict(report) -> None:
    """The comparison table and each gate decision (the full reasons are in the report)."""
    from rayb.report.sections import format_table, gate_headline

    console.print(format_table(report.verdict))
    for decision in report.gate:
        colour = {"GO": "green", "INCONCLUSIVE": "yellow"}.get(decision.outcome, "red")
        console.print(
            f"[{colour}]{escape(gate_headline(decision).replace('**', ''))}[/{colour}]", highlight=False
        )


@app.command()
def status(
    path: Annotated[
        str,
        typer.Argument(help="an output directory (every study in it) or one study directory; or their URI"),
    ],
) -> None:
    """Where a study stands, from its files: each trial's step, loss, speed, ETA and state, the evaluations,
    and, once it has finished, its comparison table and gate. Works on a study another process is running."""
    from rayb.report.status import TRIALS_NAME, status_table, study_status
    from rayb.report.study_report import build_report, read_study_dir

    studies = [
        storage.join(path, "studies", name)
        for name in storage.listdir(storage.join(path, "studies"))
        if storage.exists(storage.join(path, "studies", name, TRIALS_NAME))
    ]
    for study_dir in studies or [path]:
        try:
            state = study_status(study_dir)
        except FileNotFoundError as exc:
            _fail("path", str(exc))
        console.print(status_table(state))
        if state.finished:
            _print_verdict(build_report(*read_study_dir(study_dir)))


@app.command()
def report(
    study_dir: Annotated[
        str, typer.Argument(help="rayb_out/studies/<name>-<hash>, or its s3://, gs://... URI")
    ],
) -> None:
    """Rebuild a study's report (markdown, HTML, JSON, plots) from its results table alone."""
    from rayb.report.study_report import HTML_NAME, REPORT_NAME, build_report, read_study_dir, write_report

    try:
        study_report = build_report(*read_study_dir(study_dir))
    except (FileNotFoundError, ValueError) as exc:
        _fail("study_dir", str(exc))
    write_report(study_report, storage.writable(study_dir))
    storage.push(study_dir)  # on object storage: the rebuilt files go back beside the table
    _print_verdict(study_report)
    console.print(f"report: {storage.join(study_dir, HTML_NAME)} and {storage.join(study_dir, REPORT_NAME)}")


@app.command()
def compare(
    study_dirs: Annotated[list[str], typer.Argument(help="two or more study directories (paths or URIs)")],
    output: Annotated[Path, typer.Option("--output", "-o", help="where comparison.md/.html go")] = Path(
        "rayb_compare"
    ),
) -> None:
    """Put several studies side by side: every model, its Δ to its study's reference, its gate."""
    from rayb.report.compare import HEADER, compare_studies, write_comparison

    if len(study_dirs) < 2:
        _fail("study_dirs", "give at least two study directories to compare")
    try:
        comparison = compare_studies(study_dirs)
    except (FileNotFoundError, ValueError) as exc:
        _fail("study_dirs", str(exc))
    table = Table(title=f"{len(study_dirs)} studies")
    for column in HEADER:
        table.add_column(column)
    for row in comparison.rows:
        table.add_row(*row)
    console.print(table)
    for note in comparison.notes:
        console.print(f"[yellow]{escape(note)}[/yellow]", highlight=False)
    files = write_comparison(comparison, output)
    console.print(f"comparison: {files['html']} and {files['report']}")


data_app = typer.Typer(no_args_is_help=True, help="Fetch and cache a study's data before running it.")
app.add_typer(data_app, name="data")


@data_app.command("prepare")
def data_prepare(
    study_file: Path,
    output: Annotated[
        str | None,
        typer.Option(
            "--output", "-o", help="output directory or s3://, gs://... URI (default: the study's output_dir)"
        ),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="show Ray's own logs here too (else they go to a file)")
    ] = False,
) -> None:
    """Fetch and cache everything the study reads (run where the hub is reachable): the packed-token
    cache, named eval corpora, pretrained checkpoints and lm-eval task data. Prints a line per stage of
    the data build and one per item; Ray's own log goes to the study's log file (-v: here)."""
    from rayb.data.prepare import prepare_study
    from rayb.study import RAY_LOG, study_directory

    study = _load(study_file)
    ray_log = None if verbose else storage.writable(study_directory(study, output)) / RAY_LOG
    results = prepare_study(
        study,
        output or study.output_dir,
        log=lambda msg: console.print(f"[dim]rayb data[/dim] {escape(msg)}", highlight=False),
        ray_log=ray_log,
    )
    for item in results:
        mark = "[green]ok[/green]" if item.ok else "[red]missing[/red]"
        console.print(f"{mark} {escape(item.item)}: {escape(item.detail)}", highlight=False)
    if not all(item.ok for item in results):
        console.print(
            "Some items could not be fetched. Run this where the hub is reachable (with HF_TOKEN set for "
            "gated data), or put the files in place: local parquet for data, $RAYB_CORPORA/<name>.txt "
            "for corpora, a save_pretrained directory for checkpoints.",
            highlight=False,
        )
        raise typer.Exit(code=1)


def _fraction(text: str, option: str) -> float:
    """'5%' or '0.05' -> 0.05."""
    try:
        return float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        _fail(option, f"'{text}' is not a fraction (e.g. 5% or 0.05)")


@app.command()
def power(
    study_dir: Annotated[
        str | None, typer.Argument(help="a study directory (its results.parquet), or its URI")
    ] = None,
    diff: Annotated[str, typer.Option("--diff", help="relative difference to detect, e.g. 5%")] = "5%",
    target: Annotated[float, typer.Option("--power", help="probability of detecting it")] = 0.8,
    alpha: Annotated[float, typer.Option("--alpha", help="two-sided significance level")] = 0.05,
    metric: Annotated[str, typer.Option("--metric")] = "val_loss",
    std: Annotated[float | None, typer.Option("--std", help="seed-to-seed std, without a study")] = None,
    mean: Annotated[float | None, typer.Option("--mean", help="the metric's mean, with --std")] = None,
) -> None:
    """Seeds per model needed to detect a relative difference, from a study's (or a pilot's) spread."""

    from rayb.analysis.stats import best_by, finite_values, seeds_needed

    relative = _fraction(diff, "--diff")
    if study_dir is None:
        if std is None or mean is None:
            _fail("study_dir", "give a study directory, or --std and --mean from a pilot")
        needed = seeds_needed(std, relative * mean, target, alpha)
        console.print(f"{needed or 'more than 10,000'} seeds per model detect a {relative:.1%} difference "
                      f"(std {std:.3g}, mean {mean:.4g}) with power {target:.0%} at α = {alpha:g}")  # fmt: skip
        return
    from rayb.results import RESULTS_NAME, read_results

    results = storage.join(study_dir, RESULTS_NAME)
    if not storage.exists(results):
        _fail(
            "study_dir", f"{results} does not exist; give a study directory (rayb_out/studies/<name>-<hash>)"
        )
    try:
        table = best_by(read_results(storage.fetch(results)), "model", "lr", metric)
    except ValueError as exc:
        _fail("study_dir", str(exc))
    out = Table(
        title=f"seeds to detect a {relative:.1%} difference in {metric} (power {target:.0%}, α {alpha:g})"
    )
    for column in ("model", "seeds run", "mean", "std", "seeds needed", "enough?"):
        out.add_column(column, justify="left" if column == "model" else "right")
    for model, rows in table.groupby("model", sort=False):
        values = finite_values(rows[metric].to_numpy(float))
        if values.size < 2:
            out.add_row(str(model), str(values.size), "", "", "needs ≥ 2 seeds to measure spread", "")
            continue
        needed = seeds_needed(float(values.std(ddof=1)), relative * float(values.mean()), target, alpha)
        enough = needed is not None and values.size >= needed
        out.add_row(str(model), str(values.size), f"{values.mean():.4g}", f"{values.std(ddof=1):.3g}",
                    str(needed or "> 10,000"), "yes" if enough else "[red]no[/red]")  # fmt: skip
    console.print(out)


if __name__ == "__main__":
    app()
