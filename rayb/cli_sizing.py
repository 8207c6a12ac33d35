"""`rayb params` and `rayb match`: a model's size and cost, and the shapes of each architecture nearest a
parameter count. Commands of the `rayb` app (rayb/cli.py registers them)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
import yaml
from rich.markup import escape
from rich.table import Table

from rayb.terminal import console
from rayb.terminal import fail as _fail


def params(
    name: Annotated[str | None, typer.Argument(help="a preset, an architecture, or pkg.module:build")] = None,
    vocab: Annotated[
        int | None, typer.Option("--vocab", help="vocabulary size (preset's, else 50257)")
    ] = None,
    seq_len: Annotated[
        int | None, typer.Option("--seq-len", help="context length (preset's, else 1024)")
    ] = None,
    set_: Annotated[list[str], typer.Option("--set", help="config key=value, repeatable")] = [],  # noqa: B006
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    list_: Annotated[bool, typer.Option("--list", help="list presets and architectures")] = False,
) -> None:
    """Parameters, FLOPs per token and inference memory of a model, counted on the meta device."""
    from rayb.models import available
    from rayb.models.accounting import account
    from rayb.models.presets import PRESETS

    if list_ or name is None:
        from rayb.models.registry import get_arch

        console.print("architectures:")
        for arch in available():
            console.print(f"  {arch:<22} {get_arch(arch).description}", highlight=False)
        console.print("presets:")
        for p in PRESETS.values():
            console.print(f"  {p.name:<22} {p.arch:<8} {p.about}", highlight=False)
        return
    try:
        info = account(name, vocab, seq_len, _overrides(set_))
    except ValueError as exc:
        _fail("model", str(exc))
    if as_json:
        print(json.dumps(info))
        return
    table = Table(title=f"{name} ({info['arch']}, vocab {info['vocab_size']:,}, context {info['seq_len']:,})")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    rows = [
        ("config", json.dumps(info["config"])),
        ("total parameters", f"{info['total_params']:,}"),
        ("  embedding", f"{info['embedding_params']:,}"),
        ("  non-embedding", f"{info['non_embedding_params']:,}"),
        ("counted on meta device", f"{info['counted_total_params']:,}"),
        ("published count", f"{info['published_params']:,}" if info["published_params"] else "-"),
        ("forward FLOPs / token", f"{info['flops_per_token']:.4g}"),
        ("training FLOPs / token", f"{info['train_flops_per_token']:.4g}"),
        ("KV cache / token (bf16)", f"{info['kv_cache_bytes_per_token']:,} B"),
        ("recurrent state (bf16)", f"{info['state_bytes']:,} B"),
    ]
    for row in rows:
        table.add_row(*row)
    console.print(table)


def match(
    target: Annotated[str, typer.Option("--target", help="parameter counts, comma-separated: 3.5M,8M,30M")],
    archs: Annotated[str, typer.Option("--archs", help="comma-separated architectures")] = "gpt2,llama,mamba",
    by: Annotated[str, typer.Option("--by", help="total or non-embedding")] = "total",
    vocab: Annotated[int, typer.Option("--vocab")] = 50257,
    seq_len: Annotated[int, typer.Option("--seq-len")] = 1024,
    depth_like: Annotated[
        str | None,
        typer.Option("--depth-like", help="hold n_layer at this architecture's, solve width alone"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list")] = False,
) -> None:
    """Each architecture's shape, from its shape family, nearest each target (within ±2%, or it says so)."""
    from rayb.models.sizing import SizeError, parse_size

    if by not in ("total", "non-embedding"):
        _fail("--by", f"'{by}': use total or non-embedding")
    try:
        goals = [parse_size(t) for t in target.split(",")]
    except SizeError as exc:
        _fail("--target", str(exc))
    names = [a.strip() for a in archs.split(",") if a.strip()]
    results = [row for goal in goals for row in _match_rows(goal, names, by, vocab, seq_len, depth_like)]
    if as_json:
        print(json.dumps(results))
    else:
        for goal in goals:
            _print_matches([r for r in results if r["target"] == goal], by, vocab, seq_len, depth_like)
    if any("error" in r for r in results):
        raise typer.Exit(code=1)


def _match_rows(
    goal: int, archs: list[str], by, vocab: int, seq_len: int, depth_like: str | None
) -> list[dict]:
    from rayb.models.sizing import match as solve

    fixed = {}
    if depth_like:
        try:
            fixed = {"n_layer": solve(depth_like, goal, by, vocab, seq_len).config["n_layer"]}
        except ValueError as exc:
            return [{"arch": a, "target": goal, "error": f"--depth-like {depth_like}: {exc}"} for a in archs]
    rows = []
    for arch in archs:
        try:
            m = solve(arch, goal, by, vocab, seq_len, {} if arch == depth_like else fixed)
        except ValueError as exc:  # SizeError, or an unknown architecture
            rows.append({"arch": arch, "target": goal, "error": str(exc)})
            continue
        rows.append({
            "arch": arch, "target": goal, "config": m.config, "total_params": m.cost.total_params,
            "non_embedding_params": m.cost.non_embedding_params, "deviation": m.error,
            "flops_per_token": m.cost.forward_flops_per_token, "note": m.note,
        })  # fmt: skip
    return rows


def _print_matches(rows: list[dict], by: str, vocab: int, seq_len: int, depth_like: str | None) -> None:
    held = f", n_layer held at {depth_like}'s" if depth_like else ""
    table = Table(title=f"{rows[0]['target']:,} {by} parameters (vocab {vocab:,}, context {seq_len:,}{held})")
    for column in ("arch", "config", "total", "non-embedding", "deviation", "FLOPs/token"):
        table.add_column(column, justify="left" if column in ("arch", "config") else "right")
    for r in rows:
        if "error" in r:
            table.add_row(r["arch"], f"[red]{escape(r['error'])}[/red]", "", "", "", "")
            continue
        deviation = f"{r['deviation']:+.2%}" + (" *" if r["note"] else "")
        table.add_row(r["arch"], json.dumps(r["config"]), f"{r['total_params']:,}",
                      f"{r['non_embedding_params']:,}", deviation, f"{r['flops_per_token']:.3g}")  # fmt: skip
    console.print(table)
    for r in rows:
        if r.get("note"):
            console.print(f"  [yellow]* {escape(r['note'])}[/yellow]", highlight=False)


def _overrides(pairs: list[str]) -> dict:
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            _fail("--set", f"'{pair}' is not key=value (e.g. --set d_model=512)")
        overrides[key] = yaml.safe_load(value)  # 512 → int, true → bool, 1e-3 → float
    return overrides
