"""Atomic directories: a result appears whole or not at all, and nothing leaks when a build fails."""

from __future__ import annotations

import pytest

from rayb.files import atomic_directory


def test_a_finished_directory_appears_in_one_piece(tmp_path):
    target = tmp_path / "cache" / "built"
    with atomic_directory(target) as scratch:
        (scratch.path / "a").write_text("1")
        assert not target.exists()  # nothing is visible while it is being built
    assert scratch.won and (target / "a").read_text() == "1"
    assert sorted(p.name for p in target.parent.iterdir()) == ["built"]  # no scratch left beside it


def test_a_failed_build_leaves_nothing(tmp_path):
    target = tmp_path / "built"
    with pytest.raises(RuntimeError), atomic_directory(target) as scratch:
        (scratch.path / "half").write_text("x")
        raise RuntimeError("killed halfway")
    assert list(tmp_path.iterdir()) == []


def test_the_loser_of_a_race_uses_the_winners_directory(tmp_path):
    target = tmp_path / "built"
    with atomic_directory(target) as first:
        with atomic_directory(target) as second:
            (second.path / "who").write_text("second")
        (first.path / "who").write_text("first")
    assert second.won and not first.won
    assert (target / "who").read_text() == "second" and sorted(p.name for p in tmp_path.iterdir()) == [
        "built"
    ]


def test_a_tokenizer_that_fails_to_save_leaks_no_temp_dir(tmp_path, monkeypatch):
    from transformers import PreTrainedTokenizerFast

    from rayb.data.tokenizer import train_bpe

    def fail(self, path, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", fail)
    with pytest.raises(OSError, match="disk full"):
        train_bpe(["some text to learn merges from"] * 20, 300, tmp_path / "tok")
    assert list(tmp_path.iterdir()) == []
