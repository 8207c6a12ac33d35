"""The report's figures, each rendered to PNG bytes with matplotlib's Agg canvas (no pyplot state).

Every function takes plain results (the rows of each model at its selected learning rate, or the
analysis values) and returns None when the study measured nothing to draw, so the report can say so
instead of showing an empty frame.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from rayb.analysis.efficiency import Efficiency
    from rayb.analysis.scaling import ScalingFit


def _figure(draw: Callable[[Figure], bool], size: tuple[float, float] = (8, 5)) -> bytes | None:
    """Render what `draw` puts on a new figure; None if it drew nothing."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    if not draw(fig):
        return None
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _as_list(value: Any) -> list:
    """A list cell; missing ones (None/NaN from failed trials or unmeasured suites) become empty."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    return list(value)


def _aligned(xs_per_seed: list[list], ys_per_seed: list[list]) -> pd.DataFrame:
    """Mean/min/max across seeds per x.

    Uses the x values every seed logged, so the mean is never taken over a changing set of seeds;
    falls back to all x values if the seeds share none.
    """
    series = [
        pd.Series(np.asarray(y, dtype=float), index=np.asarray(x, dtype=float)).groupby(level=0).last()
        for x, y in zip(xs_per_seed, ys_per_seed, strict=True)
        if len(x) and len(x) == len(y)
    ]
    if not series:
        return pd.DataFrame(columns=["mean", "min", "max"])
    wide = pd.concat(series, axis=1).sort_index()
    common = wide.dropna()
    wide = common if len(common) else wide
    return pd.DataFrame({"mean": wide.mean(axis=1), "min": wide.min(axis=1), "max": wide.max(axis=1)})


def _curve(seeds: pd.DataFrame, x_col: str, y_col: str) -> pd.DataFrame:
    if x_col not in seeds or y_col not in seeds:
        return pd.DataFrame(columns=["mean", "min", "max"])
    return _aligned([_as_list(v) for v in seeds[x_col]], [_as_list(v) for v in seeds[y_col]])


def _by_model(selected: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    return [(str(m), rows) for m, rows in selected.groupby("model", sort=False)]


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def loss_curves(selected: pd.DataFrame, title: str, unigram_entropy_nats: float | None) -> bytes | None:
    """Mean training loss with a min–max band over seeds, and mean validation points, per model."""

    def draw(fig) -> bool:
        ax = fig.add_subplot()
        for i, (model, seeds) in enumerate(_by_model(selected)):
            color, label = f"C{i}", f"{model} (lr={seeds['lr'].iloc[0]:.3g})"
            train = _curve(seeds, "curve_step", "curve_train_loss")
            if len(train):
                ax.plot(train.index, train["mean"], color=color, label=f"{label} train")
                ax.fill_between(train.index, train["min"], train["max"], color=color, alpha=0.2, linewidth=0)
            val = _curve(seeds, "curve_val_step", "curve_val_loss")
            if len(val):
                ax.plot(
                    val.index, val["mean"], color=color, marker="o", linestyle="none", label=f"{label} val"
                )
        if unigram_entropy_nats is not None:
            ax.axhline(unigram_entropy_nats, color="gray", linestyle="--", label="unigram entropy")
        ax.set(xlabel="step", ylabel="loss (nats/token)", title=f"{title}: mean over seeds (band = min–max)")
        _legend(ax)
        return bool(ax.lines)

    return _figure(draw)


def pareto(rows: list[Efficiency]) -> bytes | None:
    """Validation loss against training FLOPs, with the Pareto frontier drawn through its models."""
    points = [r for r in rows if math.isfinite(r.train_flops) and math.isfinite(r.val_loss)]

    def draw(fig) -> bool:
        ax = fig.add_subplot()
        for i, r in enumerate(points):
            ax.scatter(r.train_flops, r.val_loss, color=f"C{i}", s=60, zorder=3,
                       edgecolors="black" if r.pareto else "none", label=r.model)  # fmt: skip
        front = sorted((r.train_flops, r.val_loss) for r in points if r.pareto)
        if len(front) > 1:
            ax.step(
                *zip(*front, strict=True), where="post", color="black", linewidth=1, label="Pareto frontier"
            )
        ax.set_xscale("log")
        ax.set(xlabel="training FLOPs", ylabel="validation loss (nats/token)",
               title="loss vs training compute (outlined: on the frontier)")  # fmt: skip
        _legend(ax)
        return bool(points)

    return _figure(draw, (7, 4.5))


_MULTIPLE = re.compile(r"^long_context\.ppl@(\d+)x$")


def _mean_by_column_number(ax, selected: pd.DataFrame, pattern: re.Pattern) -> None:
    """One line per model through the seed means of the columns `pattern` matches, at the number its
    group captures (a context multiple, a length), on a log2 axis; unmeasured points are left out."""
    columns = sorted((int(m.group(1)), c) for c in selected.columns if (m := pattern.match(c)))
    for i, (model, rows) in enumerate(_by_model(selected)):
        points = [(x, rows[c].astype(float).mean()) for x, c in columns]
        points = [(x, v) for x, v in points if math.isfinite(v)]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", color=f"C{i}", label=model)
    ax.set_xscale("log", base=2)


def context_scaling(selected: pd.DataFrame, seq_len: int | None) -> bytes | None:
    """Perplexity at 1×, 2×, 4×... the trained context, per model (the long_context suite)."""

    def draw(fig) -> bool:
        ax = fig.add_subplot()
        _mean_by_column_number(ax, selected, _MULTIPLE)
        unit = f" × {seq_len} tokens" if seq_len else ""
        ax.set(xlabel=f"context (multiple of the trained length{unit})", ylabel="perplexity",
               title="long-context degradation")  # fmt: skip
        _legend(ax)
        return bool(ax.lines)

    return _figure(draw, (7, 4.5))


def speed(selected: pd.DataFrame) -> bytes | None:
    """Prefill time and peak memory against sequence length, log-log, per model (the speed suite)."""

    def draw(fig) -> bool:
        time_ax, memory_ax = fig.subplots(1, 2)
        for i, (model, rows) in enumerate(_by_model(selected)):
            for ax, column in ((time_ax, "speed.scaling_s"), (memory_ax, "speed.scaling_peak_bytes")):
                curve = _curve(rows, "speed.scaling_lengths", column)
                if len(curve):
                    ax.plot(curve.index, curve["mean"], marker="o", color=f"C{i}", label=model)
        time_ax.set(
            xscale="log", yscale="log", xlabel="sequence length", ylabel="seconds", title="prefill time"
        )
        memory_ax.set(
            xscale="log", yscale="log", xlabel="sequence length", ylabel="bytes", title="peak memory"
        )
        _legend(time_ax)
        return bool(time_ax.lines or memory_ax.lines)

    return _figure(draw, (10, 4.2))


def scaling_law(selected: pd.DataFrame, fits: list[ScalingFit], extrapolate_to: list[int]) -> bytes | None:
    """Loss against parameters on log-log axes: each seed as a point, each fit as a line, dashed
    beyond the largest size trained, out to the extrapolation targets."""
    from matplotlib.ticker import FormatStrFormatter

    fitted = [f for f in fits if f.error is None]

    def draw(fig) -> bool:
        ax = fig.add_subplot()
        for i, fit in enumerate(fitted):
            rows = selected[selected["arch"] == fit.arch]
            color = f"C{i}"
            ax.scatter(rows["params_total"], rows["val_loss"], color=color, s=15, alpha=0.6)
            inside = np.geomspace(min(fit.sizes), max(fit.sizes), 50)
            outside = np.geomspace(max(fit.sizes), max([*extrapolate_to, max(fit.sizes)]), 50)
            label = f"{fit.arch}: {fit.a:.3g}·N^-{fit.b:.3f} + {fit.c:.3f}"
            ax.plot(inside, fit.loss(inside), color=color, label=label)
            ax.plot(outside, fit.loss(outside), color=color, linestyle="--")
        for size in extrapolate_to:
            ax.axvline(size, color="gray", linewidth=0.5)
        ax.set(xscale="log", yscale="log", xlabel="parameters N", ylabel="validation loss",
               title="scaling law (dashed: extrapolated)")  # fmt: skip
        for axis_formatter in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
            axis_formatter(FormatStrFormatter("%.2f"))  # a loss spans less than a decade: label plainly
        _legend(ax)
        return bool(fitted)

    return _figure(draw)


def epoch_metrics(selected: pd.DataFrame) -> bytes | None:
    """Per-epoch validation loss and perplexity, and each model-specific metric measured on the
    validation pass at each epoch's end (an MoE's expert-load Gini and entropy), mean over seeds."""
    extras = sorted(
        {name for cell in selected.get("epoch_extra", []) for e in _epoch_extras(cell) for name in e}
    )

    def draw(fig) -> bool:
        axes = fig.subplots(1, 2 + len(extras), squeeze=False)[0]
        for i, (model, rows) in enumerate(_by_model(selected)):
            loss = _epoch_curve(rows, lambda cell: _as_list(cell), "epoch_val_loss")
            if not len(loss):
                continue
            axes[0].plot(loss.index, loss["mean"], marker="o", color=f"C{i}", label=model)
            axes[1].plot(loss.index, np.exp(loss["mean"]), marker="o", color=f"C{i}", label=model)
            for ax, name in zip(axes[2:], extras, strict=True):
                curve = _epoch_curve(
                    rows,
                    lambda cell, n=name: [e.get(n, math.nan) for e in _epoch_extras(cell)],
                    "epoch_extra",
                )
                if len(curve) and curve["mean"].notna().any():
                    ax.plot(curve.index, curve["mean"], marker="o", color=f"C{i}", label=model)
        for ax, label in zip(axes, ["validation loss", "validation perplexity", *extras], strict=True):
            ax.set(xlabel="epoch", ylabel=label, title=label)
            ax.xaxis.get_major_locator().set_params(integer=True)
        _legend(axes[0])
        return bool(axes[0].lines)

    return _figure(draw, (4.2 * (2 + len(extras)), 4))


def _epoch_extras(cell: Any) -> list[dict]:
    """A results cell of per-epoch model metrics (a list of {name: value}; absent: none)."""
    return [] if cell is None else list(cell)


def _epoch_curve(rows: pd.DataFrame, values: Callable[[Any], list], column: str) -> pd.DataFrame:
    if column not in rows:
        return pd.DataFrame(columns=["mean", "min", "max"])
    ys = [values(cell) for cell in rows[column]]
    return _aligned([list(range(1, len(y) + 1)) for y in ys], ys)


def overfit(selected: pd.DataFrame) -> bytes | None:
    """The smoke protocol: each model's loss and (pre-clip) gradient norm while it memorises its
    training examples from a fresh initialisation, mean over seeds."""

    def draw(fig) -> bool:
        loss_ax, norm_ax = fig.subplots(1, 2)
        for i, (model, rows) in enumerate(_by_model(selected)):
            for ax, column in ((loss_ax, "overfit.curve_loss"), (norm_ax, "overfit.curve_grad_norm")):
                curve = _curve(rows, "overfit.curve_step", column)
                if len(curve):
                    ax.plot(curve.index, curve["mean"], color=f"C{i}", label=model)
        loss_ax.set(
            xlabel="step", ylabel="training loss (nats/token)", yscale="log", title="overfitting a fixed set"
        )
        norm_ax.set(
            xlabel="step", ylabel="gradient norm (before clipping)", yscale="log", title="gradient norms"
        )
        _legend(loss_ax)
        return bool(loss_ax.lines)

    return _figure(draw, (10, 4.2))


_BABILONG = re.compile(r"^babilong\.acc\.len(\d+)$")


def babilong(selected: pd.DataFrame) -> bytes | None:
    """BABILong-style accuracy against context length per model, with chance level."""

    def draw(fig) -> bool:
        ax = fig.add_subplot()
        _mean_by_column_number(ax, selected, _BABILONG)
        if "babilong.chance" in selected and selected["babilong.chance"].notna().any():
            ax.axhline(
                selected["babilong.chance"].astype(float).mean(), color="gray", linestyle="--", label="chance"
            )
        ax.set(xlabel="context length (tokens)", ylabel="accuracy", ylim=(0, 1.02),
               title="BABILong-style reasoning over long context")  # fmt: skip
        _legend(ax)
        return bool(ax.lines)

    return _figure(draw, (7, 4.5))
