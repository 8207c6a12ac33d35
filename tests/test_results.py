"""results.parquet has one definition (rayb/results.py): typed columns, nested values as maps and
structs, read back as the report and the analyses take them."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayb.results import RESULTS_SCHEMA, ResultRow, read_results, results_table, write_results
from rayb.train.spec import TrainSpec


def _rows() -> list[ResultRow]:
    return [
        ResultRow(
            "s", "gpt2", "gpt2", 1e-3, 0, "k0", "ok", eval_errors={"speed": "OOM"}, train=TrainSpec(lr=[1e-3, 3e-3]),
            kernels={"attention": "sdpa"}, epoch_extra=[{"expert_gini": 0.2}, {}], curve_step=[1, 2],
            curve_train_loss=[5.0, 4.0], val_loss=3.5, metrics={"speed.gen_tokens_per_s": 10.0, "speed.lengths": [1, 2]},
        ),
        ResultRow("s", "moe", "x:build", 1e-3, 0, "k1", "diverged", steps=3, metrics={"extra.expert_gini": 0.3}),
    ]  # fmt: skip


def test_nested_values_are_typed_columns_not_json_text():
    table = results_table(_rows())
    for name in ("eval_errors", "kernels"):
        assert pa.types.is_map(table.schema.field(name).type), name
    assert pa.types.is_struct(table.schema.field("train").type)
    assert table.schema.field("epoch_extra").type == pa.list_(pa.map_(pa.string(), pa.float64()))
    assert table.schema.field("speed.gen_tokens_per_s").type == pa.float64()
    assert table.schema.names[: len(RESULTS_SCHEMA)] == RESULTS_SCHEMA.names


def test_a_table_reads_back_as_it_was_written(tmp_path):
    write_results(_rows(), tmp_path / "results.parquet")
    df = read_results(tmp_path / "results.parquet")
    ok, diverged = df.iloc[0], df.iloc[1]
    assert ok.eval_errors == {"speed": "OOM"} and diverged.eval_errors == {}
    assert ok.kernels == {"attention": "sdpa"}
    assert list(ok.epoch_extra) == [{"expert_gini": 0.2}, {}]
    assert list(ok.train["lr"]) == [1e-3, 3e-3] and ok.train["precision"] == "auto"
    assert diverged.train is None and diverged.steps == 3
    assert math.isnan(diverged["speed.gen_tokens_per_s"]) and math.isnan(ok["extra.expert_gini"])


def test_a_table_from_an_older_rayb_asks_for_a_rerun(tmp_path):
    pq.write_table(pa.table({"model": ["gpt2"], "eval_errors": ["{}"]}), tmp_path / "results.parquet")
    with pytest.raises(ValueError, match="written by an older rayb .* run the study again"):
        read_results(tmp_path / "results.parquet")
