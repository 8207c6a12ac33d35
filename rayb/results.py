"""A study's results table: one row per trial, one definition for whoever writes, reads or tests it.

`ResultRow` is the row; `results_table` turns rows into the Arrow table written as results.parquet, typed
by `RESULTS_SCHEMA` (nested values are maps, lists and structs, never JSON text to decode); `read_results`
reads it back as the DataFrame the report and the analyses work on. Each evaluation adds its metrics as
`<suite>.<metric>` columns (the `lm` suite's as val_loss, val_ppl and val_bpb), and a model's own
metrics as `extra.<name>`.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from rayb.train.spec import TrainSpec

RESULTS_NAME = "results.parquet"
RESULTS_FORMAT = 2  # 2: nested values as maps and structs (1 held them as JSON text)
NAN = math.nan


@dataclass(frozen=True)
class ResultRow:
    study: str
    model: str
    arch: str
    lr: float
    seed: int
    trial_key: str
    status: str  # "ok", "diverged" or "error"
    error: str = ""
    pretrained: str = ""  # the checkpoint a pretrained reference loads ("" for a trained model)
    eval_errors: dict[str, str] = field(default_factory=dict)  # suite -> why it failed (trials that trained)
    params_total: int = 0
    params_non_embedding: int = 0
    train_tokens: int = 0
    steps: int = 0  # steps trained (a diverged trial's divergence step)
    train_flops: float = NAN
    train_flops_per_token: float = 0.0
    final_train_loss: float = NAN
    val_loss: float = NAN
    val_ppl: float = NAN
    val_bpb: float = NAN
    wall_s: float = NAN
    tokens_per_s: float = NAN
    checkpoint: str = ""
    # Architecture keyword arguments as JSON: their keys and types differ by architecture (and a user's
    # model may take anything), so no one column type holds them.
    model_config: str = "{}"
    train: TrainSpec | None = None  # the trial's training settings (a struct column)
    precision: str = ""  # what the trial computed in: fp32, bf16 (autocast) or bf16-deepspeed
    kernels: dict[str, str] = field(default_factory=dict)  # {component: implementation} it trained with
    curve_step: list[int] = field(default_factory=list)
    curve_train_loss: list[float] = field(default_factory=list)
    curve_val_step: list[int] = field(default_factory=list)
    curve_val_loss: list[float] = field(default_factory=list)
    epoch_val_loss: list[float] = field(default_factory=list)
    epoch_extra: list[dict[str, float]] = field(default_factory=list)  # a model's own metrics per epoch
    metrics: dict[str, Any] = field(default_factory=dict)  # the `<suite>.<metric>` and `extra.<name>` columns


def _arrow_type(annotation: Any) -> pa.DataType:
    """The Arrow type of a (pydantic-resolved) field annotation."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _arrow_type(args[0])
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        return _arrow_type(inner)
    if origin in (list, tuple):
        return pa.list_(_arrow_type(args[0]))
    if origin is Literal:
        return pa.string()
    return {bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}[annotation]


TRAIN_STRUCT = pa.struct([(name, _arrow_type(f.annotation)) for name, f in TrainSpec.model_fields.items()])
_COLUMN_TYPES = {
    "eval_errors": pa.map_(pa.string(), pa.string()),
    "kernels": pa.map_(pa.string(), pa.string()),
    "train": TRAIN_STRUCT,
    "curve_step": pa.list_(pa.int64()),
    "curve_train_loss": pa.list_(pa.float64()),
    "curve_val_step": pa.list_(pa.int64()),
    "curve_val_loss": pa.list_(pa.float64()),
    "epoch_val_loss": pa.list_(pa.float64()),
    "epoch_extra": pa.list_(pa.map_(pa.string(), pa.float64())),
}
_SCALAR_TYPES = {int: pa.int64(), float: pa.float64(), str: pa.string()}
_HINTS = typing.get_type_hints(ResultRow)
RESULTS_SCHEMA = pa.schema(
    [
        pa.field(f.name, _COLUMN_TYPES.get(f.name) or _SCALAR_TYPES[_HINTS[f.name]])
        for f in dataclasses.fields(ResultRow)
        if f.name != "metrics"
    ],
    metadata={"rayb_results_format": str(RESULTS_FORMAT)},
)


def _record(row: ResultRow) -> dict[str, Any]:
    record = {f.name: getattr(row, f.name) for f in dataclasses.fields(row) if f.name != "metrics"}
    record["train"] = None if row.train is None else row.train.model_dump(mode="python")
    for name in ("eval_errors", "kernels"):
        record[name] = list(record[name].items())
    record["epoch_extra"] = [list(epoch.items()) for epoch in row.epoch_extra]
    return record


def results_table(rows: list[ResultRow]) -> pa.Table:
    """The rows as a typed Arrow table: RESULTS_SCHEMA's columns, then every metric column (its type
    inferred from its values; a trial without the metric holds null)."""
    core = pa.Table.from_pylist([_record(r) for r in rows], schema=RESULTS_SCHEMA)
    names = list(dict.fromkeys(name for r in rows for name in r.metrics))
    for name in names:
        core = core.append_column(name, pa.array([r.metrics.get(name) for r in rows]))
    return core.replace_schema_metadata(RESULTS_SCHEMA.metadata)


def results_frame(rows: list[ResultRow]) -> pd.DataFrame:
    """The rows as the DataFrame `read_results` gives (what the report and the analyses take)."""
    return _to_frame(results_table(rows))


def write_results(rows: list[ResultRow], path: Path) -> pd.DataFrame:
    table = results_table(rows)
    pq.write_table(table, path)
    return _to_frame(table)


def read_results(path: Path) -> pd.DataFrame:
    """results.parquet as a DataFrame: maps as dicts, structs as dicts, lists as arrays. ValueError for a
    table an older rayb wrote (run the study again: it redoes no finished work)."""
    table = pq.read_table(path)
    found = (table.schema.metadata or {}).get(b"rayb_results_format", b"1").decode()
    if found != str(RESULTS_FORMAT):
        raise ValueError(
            f"{path} was written by an older rayb (results format {found}, this one reads {RESULTS_FORMAT}); "
            "run the study again, which redoes no finished work and rewrites it"
        )
    return _to_frame(table)


def _to_frame(table: pa.Table) -> pd.DataFrame:
    return table.to_pandas(maps_as_pydicts="strict")
