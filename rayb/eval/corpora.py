"""Named evaluation corpora (WikiText-2/103, Penn Treebank, a PG19 subset, enwik8) as plain text.

`lm:NAME` evaluates on a corpus by name or by path. `lm:embedded://web?docs=40&seed=9` is a stand-in
generated on the spot from rayb's embedded corpus (tiny studies use these offline). A path (.txt, .jsonl or
.parquet with a `text` column) is read as is, by the driver as it hands the evaluations out (`read_corpus`):
eval actors on any node score the text it read, so the file need not be on a shared file system. A name is
looked up in `corpora_dir()` (`$RAYB_CORPORA`, default ~/.cache/rayb/corpora) as `NAME.txt`; when it is
missing and the hub is reachable, the named dataset is downloaded once with `datasets` and written there,
so later runs (and offline machines sharing the directory) read the local copy. Register more with
`register_corpus`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from rayb.data.corpus import SOURCES, generate_documents
from rayb.data.sources import embedded_args
from rayb.files import write_atomic
from rayb.registry import Registry


@dataclass(frozen=True)
class HubCorpus:
    dataset: str
    config: str | None
    split: str
    column: str
    joiner: str = "\n"
    max_rows: int | None = None  # a subset, e.g. PG19's first books


CORPORA: Registry[HubCorpus] = Registry("evaluation corpus")


def register_corpus(name: str, corpus: HubCorpus) -> HubCorpus:
    return CORPORA.register(name, corpus)


register_corpus("wikitext2", HubCorpus("Salesforce/wikitext", "wikitext-2-raw-v1", "test", "text", ""))
register_corpus("wikitext103", HubCorpus("Salesforce/wikitext", "wikitext-103-raw-v1", "test", "text", ""))
register_corpus("ptb", HubCorpus("ptb-text-only/ptb_text_only", None, "test", "sentence"))
register_corpus("pg19", HubCorpus("deepmind/pg19", None, "test", "text", "\n\n", max_rows=10))
register_corpus("enwik8", HubCorpus("LTCB/enwik8", None, "test", "text", "\n"))


def corpora_dir() -> Path:
    return Path(os.environ.get("RAYB_CORPORA", Path.home() / ".cache" / "rayb" / "corpora")).expanduser()


@dataclass(frozen=True)
class CorpusText:
    """A corpus file's text, read by the driver: jobs carry it to eval actors on any node, which need not
    have the file (it was named on the driver's disk)."""

    text: str


def resolve_corpus(argument: str, base_dir: Path) -> str:
    """`lm:ARGUMENT` checked when a study is resolved: a path must exist (a relative one is read from the
    study file's directory, and returned absolute); otherwise the name must be registered."""
    if argument.startswith("embedded://"):
        _embedded_text_args(argument)
        return argument
    if _is_path(argument):
        path = base_dir / Path(argument).expanduser()
        if not path.exists():
            raise ValueError(f"corpus file '{argument}' does not exist (looked for {path})")
        return str(path.resolve())
    if argument not in CORPORA:
        raise ValueError(CORPORA.unknown(argument) + "; or give a file path")
    return argument


def read_corpus(argument: str) -> str | CorpusText:
    """A resolved `lm:` argument as jobs carry it: a file's text, read here; a name or generated corpus as
    is (each node reads those from its own corpora_dir, or makes them)."""
    if _is_path(argument):
        return CorpusText(read_text_file(Path(argument)))
    return argument


def _is_path(argument: str) -> bool:
    return not argument.startswith("embedded://") and ("/" in argument or "." in argument)


def _embedded_text_args(uri: str) -> tuple[str, int, int]:
    source, docs, seed = embedded_args(uri)
    if source not in SOURCES:
        raise ValueError(f"'{uri}': an evaluation corpus is one of the text sources {', '.join(SOURCES)}")
    return source, docs, seed


def load_corpus(argument: str | CorpusText) -> str:
    if isinstance(argument, CorpusText):
        return argument.text
    if argument.startswith("embedded://"):
        return "\n\n".join(generate_documents(*_embedded_text_args(argument)))
    path = Path(argument).expanduser()
    if path.exists():
        return read_text_file(path)
    local = corpora_dir() / f"{argument}.txt"
    if local.exists():
        return local.read_text(encoding="utf-8")
    if argument not in CORPORA:
        raise ValueError(CORPORA.unknown(argument) + "; or give a file path")
    return fetch_corpus(argument)


def fetch_corpus(name: str) -> str:
    """Download a registered corpus from the hub and keep it in corpora_dir()."""
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        raise RuntimeError(
            f"corpus '{name}' is not in {corpora_dir()} and the hub is switched off (HF_HUB_OFFLINE); "
            f"fetch it on a machine with access, or put its text at {corpora_dir() / (name + '.txt')}"
        )
    from datasets import load_dataset

    spec = CORPORA.get(name)
    rows = load_dataset(spec.dataset, spec.config, split=spec.split)
    if spec.max_rows is not None:
        rows = rows.select(range(min(spec.max_rows, len(rows))))
    text = spec.joiner.join(rows[spec.column])
    target = corpora_dir() / f"{name}.txt"
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, text.encode("utf-8"))
    return text


def read_text_file(path: Path) -> str:
    if path.suffix == ".parquet":
        return "\n".join(pq.read_table(path, columns=["text"]).column("text").to_pylist())
    if path.suffix == ".jsonl":
        lines = path.read_text(encoding="utf-8").splitlines()
        return "\n".join(json.loads(line)["text"] for line in lines if line.strip())
    return path.read_text(encoding="utf-8")
