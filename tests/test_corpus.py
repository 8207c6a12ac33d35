"""Tests for the embedded corpus generator (rayb.data.corpus). Fast, no Ray."""

from __future__ import annotations

import re
import statistics

import pyarrow.parquet as pq
import pytest

from rayb.data import corpus
from rayb.data.corpus import ANSWER_PREFIX, QUESTION_PREFIX, SOURCES, generate_documents, write_corpus


@pytest.mark.parametrize("source", SOURCES)
def test_same_arguments_give_identical_text(source):
    assert generate_documents(source, 30, seed=7) == generate_documents(source, 30, seed=7)


def test_seeds_and_sources_differ():
    edu0, edu1, web0 = (generate_documents(s, 20, seed) for s, seed in (("edu", 0), ("edu", 1), ("web", 0)))
    assert len(set(edu0)) == 20  # no repeated documents within one corpus either
    assert not set(edu0) & set(edu1)
    assert not set(edu0) & set(web0)


@pytest.mark.parametrize("source", SOURCES)
def test_document_does_not_depend_on_n_docs(source):
    many = generate_documents(source, 40, seed=3)
    assert generate_documents(source, 10, seed=3) == many[:10]
    assert corpus.generate_document(source, 3, 25) == many[25]


def test_unknown_source_raises(tmp_path):
    with pytest.raises(ValueError, match="edu, web"):
        generate_documents("wiki", 3, seed=0)
    with pytest.raises(ValueError, match="valid sources"):
        write_corpus(tmp_path / "c", "wiki", n_docs=3, seed=0)


@pytest.mark.parametrize("source", SOURCES)
def test_lengths_and_vocabulary(source):
    docs = generate_documents(source, 600, seed=11)
    words = [len(doc.split()) for doc in docs]
    assert 200 <= statistics.mean(words) <= 320
    assert min(words) >= 40 and max(words) <= 700
    vocabulary = {w for doc in docs for w in doc.split()}
    assert len(vocabulary) > 1000  # common words plus invented names: a rich unigram distribution


@pytest.mark.parametrize("source", SOURCES)
def test_every_answer_is_stated_before_its_question(source):
    for doc in generate_documents(source, 300, seed=5):
        answers = corpus.recall_answers(doc)
        assert len(answers) >= 2, doc
        for offset, answer in answers:
            question_at = doc.rfind(QUESTION_PREFIX, 0, offset)
            assert question_at >= 0 and doc[offset - len(ANSWER_PREFIX) : offset] == ANSWER_PREFIX
            assert answer in doc[:question_at], (answer, doc)


@pytest.mark.parametrize("source", SOURCES)
def test_questions_are_unambiguous(source):
    # The same question asked twice in one document must have the same answer (no entity stated twice).
    pattern = re.compile(f"^{QUESTION_PREFIX}(.+)\n{ANSWER_PREFIX}(.+)$", re.MULTILINE)
    for doc in generate_documents(source, 300, seed=9):
        seen: dict[str, str] = {}
        for question, answer in pattern.findall(doc):
            assert seen.setdefault(question, answer) == answer, doc


def test_edu_arithmetic_is_correct():
    ops = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b, "times": lambda a, b: a * b}
    found = 0
    for doc in generate_documents("edu", 200, seed=2):
        for a, op, b, c in re.findall(r"\b(\d+) (plus|minus|times) (\d+) equals (\d+)\.", doc):
            assert ops[op](int(a), int(b)) == int(c)
            found += 1
    assert found > 50


def test_write_corpus_shards_and_rows(tmp_path):
    out = tmp_path / "edu-corpus"
    paths = write_corpus(out, "edu", n_docs=25, seed=4, docs_per_shard=10)
    assert [p.name for p in paths] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert (out / corpus.SUCCESS_MARKER).exists()
    tables = [pq.read_table(p) for p in paths]
    assert all(t.column_names == ["text"] for t in tables)
    assert [t.num_rows for t in tables] == [10, 10, 5]
    texts = [text for t in tables for text in t.column("text").to_pylist()]
    assert texts == generate_documents("edu", 25, seed=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edu-corpus"]  # no temporary directory left over


def test_write_corpus_reuses_a_complete_corpus(tmp_path):
    out = tmp_path / "web-corpus"
    first = write_corpus(out, "web", n_docs=12, seed=1, docs_per_shard=5)
    mtimes = [p.stat().st_mtime_ns for p in first]
    second = write_corpus(str(out), "web", n_docs=12, seed=1, docs_per_shard=5)
    assert second == first
    assert [p.stat().st_mtime_ns for p in second] == mtimes
    with pytest.raises(ValueError, match="different corpus"):
        write_corpus(out, "web", n_docs=13, seed=1)


def test_write_corpus_refuses_an_incomplete_directory(tmp_path):
    out = tmp_path / "half"
    out.mkdir()
    (out / "part-00000.parquet").write_bytes(b"not a finished corpus")
    with pytest.raises(FileExistsError):
        write_corpus(out, "edu", n_docs=3, seed=0)


def test_write_corpus_into_an_existing_empty_directory(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    paths = write_corpus(out, "edu", n_docs=3, seed=0)
    assert pq.read_table(paths[0]).num_rows == 3
