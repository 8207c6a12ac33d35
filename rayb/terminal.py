"""The terminal the `rayb` commands write to, and how they refuse bad input."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape

# Wide enough for the comparison table when the output is a log file rather than a terminal.
console = Console(width=None if sys.stdout.isatty() else 180)


def fail(what: str, message: str) -> None:
    """Refuse an invalid argument, naming it: exit status 2, as for any usage error."""
    console.print(f"[red]invalid {what}[/red] {escape(message)}", highlight=False)
    raise typer.Exit(code=2)
