"""Copies of results on object storage through pyarrow filesystems (file:// here: the same pyarrow
code path as s3:// and gs://, which this machine cannot reach)."""

from __future__ import annotations

import os

import pytest
from conftest import tiny_study_dict
from typer.testing import CliRunner

from rayb.archive import archive, open_archive
from rayb.cli import app


def _tree(out):
    files = {
        "studies/s-1/results.parquet": b"table",
        "studies/s-1/report.md": b"# report",
        "trials/gpt2-abc/metrics.jsonl": b'{"step": 1}\n',
        "trials/gpt2-abc/model/model.safetensors": os.urandom(3 << 20),
        "trials/gpt2-abc/eval/lm-1234.json": b"{}",
    }
    for name, data in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    return files


def test_archive_mirrors_the_layout_and_sends_only_what_changed(tmp_path):
    out, dest = tmp_path / "out", tmp_path / "bucket"
    files = _tree(out)
    dirs = [out / "studies" / "s-1", out / "trials" / "gpt2-abc"]
    first = archive(out, dirs, dest.as_uri() + "/rayb")
    assert (first.copied, first.unchanged) == (5, 0)
    for name, data in files.items():
        assert (dest / "rayb" / name).read_bytes() == data

    assert (archive(out, dirs, dest.as_uri() + "/rayb").copied) == 0  # a rerun with nothing new
    report = out / "studies" / "s-1" / "report.md"
    report.write_bytes(b"# rep0rt")  # same size, newer content: copied again
    os.utime(report, (report.stat().st_atime, report.stat().st_mtime + 5))
    again = archive(out, dirs, dest.as_uri() + "/rayb")
    assert (again.copied, again.unchanged) == (1, 4)
    assert (dest / "rayb" / "studies" / "s-1" / "report.md").read_bytes() == b"# rep0rt"


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("/mnt/backup", "an archive is a URI such as s3://bucket/prefix"),
        ("nope://bucket/x", "pyarrow cannot open it as a filesystem"),
        ("s3://", "name a bucket or directory"),
    ],
)
def test_bad_archive_uris_are_named(uri, message):
    with pytest.raises(ValueError, match=message):
        open_archive(uri)


def test_run_rejects_a_bad_archive_before_any_work(tmp_path):
    import yaml

    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump(tiny_study_dict()))
    result = CliRunner().invoke(
        app, ["run", str(study), "--archive", "nope://x/y", "-o", str(tmp_path / "o")]
    )
    assert result.exit_code == 2 and "invalid --archive" in result.output
    assert not (tmp_path / "o").exists()  # nothing started


def test_a_failed_copy_is_reported_and_loses_nothing(tmp_path):
    from rayb.runner import _archive

    out = tmp_path / "out"
    files = _tree(out)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the archive needs a directory")
    error = _archive(out, out / "studies" / "s-1", [], (blocker / "rayb").as_uri(), log=print)
    assert error.startswith(f"could not archive to {(blocker / 'rayb').as_uri()}: ")
    assert all((out / name).read_bytes() == data for name, data in files.items())  # the results stay
