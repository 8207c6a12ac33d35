"""The held-out split: a seeded random sample of whole documents, the same however the cache is built.

The corpus here is stored in topic order (one parquet file per topic, files sorted by name) and every
document carries its id as a marker, `<0042>`, repeated through its text. With the byte-level tokenizer a
row decodes to exactly its bytes, so the ids found in a row say which documents it holds.
"""

from __future__ import annotations

import random
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import tiny_study_dict
from tokenizers import Tokenizer

from rayb.data import pipeline
from rayb.data.pipeline import data_key, prepare_data
from rayb.data.sources import resolve
from rayb.data.split import HeldOutRule
from rayb.study import parse_study

TOPICS = ("astronomy", "botany", "chemistry", "dance")
DOCS_PER_TOPIC = 150
SEQ_LEN = 32
MARKER = re.compile(r"<(\d{4})>")


def _document(doc_id: int, topic: str) -> str:
    # Whole markers every 6 bytes: any part of a document in a row longer than 11 bytes names it.
    return f"{topic} notes " + f"<{doc_id:04d}>" * (4 + doc_id * 7 % 20)


def _write_corpus(directory, row_group_size: int) -> list[str]:
    """One file per topic, in topic order; returns every document, in corpus order."""
    directory.mkdir(parents=True)
    documents = []
    for t, topic in enumerate(TOPICS):
        texts = [_document(t * DOCS_PER_TOPIC + i, topic) for i in range(DOCS_PER_TOPIC)]
        table = pa.table({"text": texts})
        pq.write_table(table, directory / f"{t}-{topic}.parquet", row_group_size=row_group_size)
        documents += texts
    return documents


def _spec(directory, models: list[dict] | None = None):
    raw = tiny_study_dict()
    raw["data"] = {
        "sources": [{"name": "notes", "uri": str(directory), "weight": 1.0}],
        "tokenizer": "bytes", "seq_len": SEQ_LEN, "token_budget": SEQ_LEN * 1280, "val_share": 0.1, "seed": 0,
    }  # fmt: skip
    if models:
        raw["models"] = models
    return parse_study(raw).data


def _ids(rows: np.ndarray, tokenizer: Tokenizer) -> set[int]:
    """The documents whose markers the rows hold (rows decoded one by one: a row is a fragment)."""
    return {int(i) for row in np.asarray(rows) for i in MARKER.findall(tokenizer.decode(row.tolist()))}


def _doc_id(text: str) -> int:
    return int(MARKER.search(text).group(1))


@pytest.fixture(scope="module")
def corpus(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("split")
    documents = _write_corpus(root / "notes", row_group_size=20)
    spec = _spec(root / "notes")
    cache = prepare_data(spec, root / "cache")
    return documents, spec, cache, Tokenizer.from_file(str(cache.tokenizer_dir / "tokenizer.json"))


def test_the_rule_samples_documents_by_their_text_at_the_share_asked():
    rule = HeldOutRule(seed=0, val_share=0.05)
    texts = [f"document {i}: {random.Random(i).random()}" for i in range(20_000)]
    held = [rule.held(t) for t in texts]
    assert abs(sum(held) / len(texts) - 0.05 / 1.05) < 0.005  # held-out tokens ≈ val_share × training ones
    assert held == [HeldOutRule(0, 0.05).held(t) for t in texts]  # a function of (seed, text) alone
    assert held != [HeldOutRule(1, 0.05).held(t) for t in texts]  # another seed, another sample
    assert rule.held("") == rule.held("")


@pytest.mark.ray
def test_no_validation_document_reaches_a_training_row(corpus):
    documents, spec, cache, tokenizer = corpus
    held = {_doc_id(t) for t in documents if spec.held_out.held(t)}
    train, val = _ids(cache.train, tokenizer), _ids(cache.val, tokenizer)
    assert val and train
    assert not train & val  # no document split between the two
    assert val <= held and not train & held  # validation holds held-out documents only, training none
    assert val == {_doc_id(t) for t in cache.held_out.documents}  # the record names the rows' documents


@pytest.mark.ray
def test_a_topic_ordered_corpus_is_held_out_across_its_topics(corpus):
    """Holding out the first rows would make validation all astronomy; a random sample spans the topics."""
    documents, spec, cache, tokenizer = corpus
    val_topics = {documents[i].split()[0] for i in _ids(cache.val, tokenizer)}
    assert len(val_topics) >= 3, val_topics
    assert {documents[i].split()[0] for i in _ids(cache.train, tokenizer)} == set(TOPICS)


@pytest.mark.ray
def test_the_split_is_the_same_for_every_model_and_every_worker_count(corpus, tmp_path, monkeypatch):
    """The cache is keyed by the data alone, so every model reads the same one; and it is the same
    whether one task or four build it, over large row groups or small ones (other units, other rounds)."""
    _, spec, cache, _ = corpus
    other_models = _spec(
        spec.sources[0].location, [{"arch": "llama", "config": {"d_model": 64, "n_layer": 3, "n_head": 4}}]
    )
    resolved = {s.name: resolve(s.location, tmp_path) for s in spec.sources}
    assert data_key(other_models, resolved) == data_key(spec, resolved)
    for cores, row_group_size in ((1, 60), (4, 7)):
        monkeypatch.setattr(pipeline, "_cores", lambda cores=cores: cores)
        _write_corpus(tmp_path / f"notes-{cores}", row_group_size)
        built = prepare_data(_spec(tmp_path / f"notes-{cores}"), tmp_path / f"cache-{cores}")
        assert np.array_equal(built.val, cache.val) and np.array_equal(built.train, cache.train)
        assert built.held_out.documents == cache.held_out.documents
