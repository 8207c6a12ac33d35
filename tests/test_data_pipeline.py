"""The Ray Data step: mixing, splitting, budget, determinism and reuse of the token cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import tiny_study_dict

from rayb.data.pipeline import SourceTooSmall, prepare_data
from rayb.data.tokenizer import load_tokenizer
from rayb.data.units import BadShard
from rayb.study import parse_study

pytestmark = pytest.mark.ray


def test_cache_shape_and_mix(tiny_cache):
    spec = parse_study(tiny_study_dict()).data
    m = tiny_cache.manifest
    assert tiny_cache.train.shape == (spec.train_rows, spec.seq_len)
    assert tiny_cache.val.shape == (spec.val_rows, spec.seq_len)
    assert m["train_tokens"] == spec.train_rows * spec.seq_len <= spec.token_budget
    # Row counts follow the weights exactly (largest-remainder rounding).
    assert m["sources"]["edu"]["train_rows"] == round(0.6 * spec.train_rows)
    assert m["sources"]["edu"]["train_rows"] + m["sources"]["web"]["train_rows"] == spec.train_rows
    assert 0 < m["unigram_entropy_nats"] < np.log(m["vocab_size"])
    assert (
        tiny_cache.held_out.scored_bytes.shape == (spec.val_rows,)
        and tiny_cache.held_out.scored_bytes.min() > 0
    )


def test_rows_are_real_text_with_document_separators(tiny_cache):
    tok = load_tokenizer(tiny_cache.tokenizer_dir)
    text = tok.decode(np.asarray(tiny_cache.train[:8]).ravel())
    assert "<|endoftext|>" in text or tiny_cache.manifest["eos_id"] in np.asarray(tiny_cache.train)
    assert sum(c.isalpha() for c in text) > len(text) / 2
    # Held-out rows never appear in training.
    train = {bytes(r) for r in np.asarray(tiny_cache.train)}
    assert not any(bytes(r) in train for r in np.asarray(tiny_cache.val))


def test_cache_is_reused_and_deterministic(tiny_cache, tmp_path):
    spec = parse_study(tiny_study_dict()).data
    before = (tiny_cache.path / "train.bin").stat().st_mtime_ns
    again = prepare_data(spec, tiny_cache.path.parent.parent)
    assert again.path == tiny_cache.path
    assert (again.path / "train.bin").stat().st_mtime_ns == before
    # A fresh build elsewhere gives byte-identical tokens in the identical order.
    fresh = prepare_data(spec, tmp_path)
    np.testing.assert_array_equal(np.asarray(fresh.train), np.asarray(tiny_cache.train))
    np.testing.assert_array_equal(np.asarray(fresh.val), np.asarray(tiny_cache.val))


def test_other_seed_draws_another_held_out_sample_and_order(tiny_cache, tmp_path):
    raw = tiny_study_dict()
    raw["data"]["seed"] = 1
    other = prepare_data(parse_study(raw).data, tmp_path)
    assert other.path.name != tiny_cache.path.name
    assert not np.array_equal(np.asarray(other.train), np.asarray(tiny_cache.train))
    assert set(other.held_out.documents) != set(tiny_cache.held_out.documents)


def test_local_parquet_source_and_too_small_source(ray_session, tmp_path):
    shard = tmp_path / "mine" / "part-0.parquet"
    shard.parent.mkdir()
    pq.write_table(
        pa.table({"body": [f"short document {i} about rivers and cities. " * 20 for i in range(30)]}), shard
    )
    raw = tiny_study_dict()
    raw["data"]["sources"] = [
        {"name": "mine", "uri": str(shard.parent), "weight": 1.0, "text_column": "body"}
    ]
    raw["data"]["tokenizer"] = "bpe:300"
    raw["data"]["token_budget"] = 32 * 8 * 4
    cache = prepare_data(parse_study(raw).data, tmp_path / "out")
    assert cache.manifest["sources"]["mine"]["train_rows"] == 32

    raw["data"]["token_budget"] = 32 * 8 * 400
    with pytest.raises(
        SourceTooSmall, match=r"data source 'mine' .* holds [\d,]+ training tokens and [\d,]+ held-out"
    ):
        prepare_data(parse_study(raw).data, tmp_path / "out")


def test_corrupt_shard_and_missing_column_are_named(ray_session, tmp_path):
    good = tmp_path / "src" / "part-0.parquet"
    good.parent.mkdir()
    pq.write_table(pa.table({"text": ["some text"] * 10}), good)
    bad = tmp_path / "src" / "part-1.parquet"
    bad.write_bytes(b"this is not parquet")
    raw = tiny_study_dict()
    raw["data"]["sources"] = [{"name": "mine", "uri": str(good.parent), "weight": 1.0}]
    with pytest.raises(BadShard, match=r"cannot read parquet shard .*part-1\.parquet"):
        prepare_data(parse_study(raw).data, tmp_path / "out")
    bad.unlink()
    raw["data"]["sources"][0]["text_column"] = "body"
    with pytest.raises(BadShard, match=r"part-0\.parquet has no text column 'body'; its columns: \['text'\]"):
        prepare_data(parse_study(raw).data, tmp_path / "out")
    assert not (tmp_path / "out" / "data").exists()  # nothing half-written


def test_the_held_out_record_is_rebuilt_from_its_documents_and_must_match_val_bin(tiny_cache):
    """The record's documents, tokenized again here and packed by the record's rules, reproduce val.bin
    token for token and the record itself; a record that would not is refused."""
    from tokenizers import Tokenizer

    from rayb.data import held_out

    record, m = tiny_cache.held_out, tiny_cache.manifest
    rows = [m["sources"][name]["val_rows"] for name in ("edu", "web")]
    edu_docs = 1 + max(doc for items in record.rows[: rows[0]] for doc, _, _ in items)
    tokenizer = Tokenizer.from_file(str(tiny_cache.tokenizer_dir / "tokenizer.json"))

    def tokenized(texts):
        encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
        table = held_out.documents_table(texts, [e.ids for e in encodings], [e.offsets for e in encodings])
        return held_out.documents(table)

    def rebuild(expected):
        per_source = [tokenized(record.documents[:edu_docs]), tokenized(record.documents[edu_docs:])]
        return held_out.build(per_source, rows, tiny_cache.seq_len, m["eos_id"], expected)

    rebuilt = rebuild(tiny_cache.val)
    assert rebuilt.rows == record.rows and (rebuilt.scored_bytes == record.scored_bytes).all()
    tampered = np.array(tiny_cache.val)
    tampered[5] += 1
    with pytest.raises(ValueError, match="differ from the rows packed into val.bin"):
        rebuild(tampered)


def test_data_prepare_prints_a_line_per_stage_and_sends_ray_data_to_the_log(ray_session, tmp_path):
    """`rayb data prepare`, as a user runs it (its own process, here on the suite's Ray): a line per stage
    of the build and a summary, in a few lines; Ray Data's own log in the study's log file, not here."""
    import os
    import subprocess
    import sys

    import ray
    import yaml

    from rayb.study import RAY_LOG, study_directory

    raw = tiny_study_dict(output_dir=str(tmp_path / "out"))
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(raw))
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    env.pop("RAY_DATA_DISABLE_PROGRESS_BARS")  # a user's shell: the console must stay quiet on its own
    done = subprocess.run([sys.executable, "-m", "rayb.cli", "data", "prepare", str(tmp_path / "study.yaml")],
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    lines = output.splitlines()
    assert len(lines) < 15, output
    for stage in ("tokenizer: bpe:512", "tokenize: ", "place: ", "held-out record: "):
        assert any(line.startswith(f"rayb data {stage}") for line in lines), (stage, output)
    assert any(line.startswith("ok data (tokenize, pack, mix): ") and " rows of 32 tokens " in line
               for line in lines), output  # fmt: skip
    log = (Path(study_directory(parse_study(raw))) / RAY_LOG).read_text()
    assert "ray.data" in log and "Dataset" in log, log[-2000:]
