"""A copy of a study's results on object storage, so they outlive the cluster that made them.

Trials run in the output directory: local on a laptop, a shared mount (NFS, EFS, Filestore) on a
cluster. `rayb run --archive URI` then copies the study's directory (results table, provenance, report)
and each of its trials' directories (metrics, final model, evaluations) to any filesystem pyarrow opens
by URI: `s3://bucket/prefix`, `gs://bucket/prefix`, `hdfs://...`, `file:///mnt/backup`. The archive has
the output directory's own layout, so `rayb report` works on a downloaded copy. A file already archived
(same size, written after the file last changed) is not copied again: a rerun sends only what changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Archived:
    uri: str
    copied: int
    unchanged: int


def open_archive(uri: str):
    """(pyarrow filesystem, base path) for a URI; ValueError naming it when pyarrow cannot open it.
    Credentials come from the environment (instance roles, AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS)."""
    import pyarrow.fs as pafs

    if "://" not in uri:
        raise ValueError(
            f"'{uri}': an archive is a URI such as s3://bucket/prefix, gs://bucket/prefix or file:///path"
        )
    try:
        fs, base = pafs.FileSystem.from_uri(uri)
    except (ValueError, OSError) as exc:  # pyarrow's ArrowInvalid and ArrowIOError are these
        raise ValueError(f"'{uri}': pyarrow cannot open it as a filesystem: {exc}") from None
    if not base.strip("/"):
        raise ValueError(f"'{uri}': name a bucket or directory to archive into, e.g. s3://bucket/rayb")
    return fs, base


def _up_to_date(copy, source: Path) -> bool:
    """The archived copy has the source's size and was written after the source last changed."""
    if copy is None or copy.size != source.stat().st_size or copy.mtime is None:
        return False
    return copy.mtime.timestamp() >= source.stat().st_mtime


def archive(out_dir: Path, dirs: list[Path], uri: str) -> Archived:
    """Copy every file under `dirs` (each inside `out_dir`) to the same relative path under `uri`."""
    import pyarrow.fs as pafs

    fs, base = open_archive(uri)
    files = sorted(f for d in dirs for f in Path(d).rglob("*") if f.is_file() and not f.name.startswith("."))
    targets = [f"{base.rstrip('/')}/{f.relative_to(out_dir).as_posix()}" for f in files]
    present = {info.path: info for info in fs.get_file_info(targets) if info.type == pafs.FileType.File}
    local = pafs.LocalFileSystem()
    copied = 0
    for source, target in zip(files, targets, strict=True):
        if _up_to_date(present.get(target), source):
            continue
        fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        pafs.copy_files(str(source), target, source_filesystem=local, destination_filesystem=fs)
        copied += 1
    return Archived(uri, copied, len(files) - copied)
