"""The `rayb` command: run and validate studies."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from rayb.study import StudyError, check_output_dir, load_study

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Fair architecture comparisons on Ray.")
# Wide enough for the comparison table when the output is a log file rather than a terminal.
console = Console(width=None if sys.stdout.isatty() else 180)


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
    trials = len(study.models) * len(study.train.lr) * len(study.seeds)
    console.print(
        f"[green]ok[/green] {study.name}: {len(study.models)} models × {len(study.train.lr)} lr × "
        f"{len(study.seeds)} seeds = {trials} trials, {study.steps} steps of "
        f"{study.train.global_batch}×{study.data.seq_len} tokens"
    )


@app.command()
def run(
    study_file: Path,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="output directory (default: the study's output_dir)")
    ] = None,
) -> None:
    """Run a study end to end on a local Ray, or on the cluster at RAY_ADDRESS."""
    study = _load(study_file)  # before Ray starts: bad input costs nothing
    if output is not None:
        try:
            check_output_dir(str(output))
        except ValueError as exc:
            console.print(f"[red]invalid --output[/red] {escape(str(exc))}", highlight=False)
            raise typer.Exit(code=2) from None
    from rayb.report.study_report import format_table
    from rayb.runner import run_study

    outcome = run_study(
        study, output, log=lambda msg: console.print(f"[dim]rayb[/dim] {msg}", highlight=False)
    )
    console.print(format_table(outcome.verdict))
    for key, error in outcome.errors.items():
        console.print(f"[red]trial {key} failed[/red]: {escape(error)}", highlight=False)
    console.print(
        f"trained {outcome.trained} trials, evaluated {outcome.evaluated} in {outcome.wall_s:.0f}s; "
        f"report: {outcome.files['report']}"
    )
    if outcome.errors:
        raise typer.Exit(code=1)


if __name__ == "__main__":
    app()
