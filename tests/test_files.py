"""Atomic directories: a result appears whole or not at all, and nothing leaks when a build fails; one build
at a time on a machine, and no lock left by a build killed midway."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from rayb.files import atomic_directory, one_at_a_time


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


def test_one_builder_at_a_time_the_next_enters_when_the_first_leaves(tmp_path):
    lock, events = tmp_path / "builds" / "scan.lock", []

    def build(name: str) -> None:
        with one_at_a_time(lock):
            events.append(f"{name} in")
            time.sleep(0.3)
            events.append(f"{name} out")

    first = threading.Thread(target=build, args=("first",))
    first.start()
    while not events:  # the first holds the lock
        time.sleep(0.01)
    second = threading.Thread(target=build, args=("second",))
    second.start()
    first.join(), second.join()
    assert events == ["first in", "first out", "second in", "second out"]


def test_a_builder_killed_midway_leaves_no_lock(tmp_path):
    lock = tmp_path / "scan.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import time; from rayb.files import one_at_a_time\n"
         f"with one_at_a_time(__import__('pathlib').Path({str(lock)!r})):\n print('in', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "in"
    entered = threading.Event()

    def build() -> None:
        with one_at_a_time(lock):
            entered.set()

    threading.Thread(target=build, daemon=True).start()
    assert not entered.wait(0.5)  # held by the live process
    holder.kill()
    holder.wait()
    assert entered.wait(10)


def test_where_no_lock_can_be_had_the_build_runs_unguarded(tmp_path):
    (tmp_path / "a file").write_text("")
    with one_at_a_time(tmp_path / "a file" / "scan.lock"):  # its directory cannot be made
        ran = True
    assert ran
