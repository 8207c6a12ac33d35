"""`rayb data prepare`: fetch and cache everything a study reads, so the run itself needs no hub.

Run it where the hub is reachable (a login node, a laptop) with the output directory the cluster
shares: it builds the packed-token cache (downloading hub data sources and the tokenizer), writes the
named evaluation corpora to `corpora_dir()`, and puts pretrained checkpoints and lm-eval task data in
the Hugging Face cache. Each item is attempted on its own; what could not be fetched is listed with the
reason, and the rest stays cached. Offline, it is the check of what a run would be missing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rayb.study import Study


@dataclass(frozen=True)
class Prepared:
    item: str  # "data", "corpus wikitext103", "pretrained EleutherAI/pythia-160m", "lm_eval hellaswag"
    ok: bool
    detail: str


def prepare_study(
    study: Study, output: Path | str, log: Callable[[str], None] = print, ray_log: Path | None = None
) -> list[Prepared]:
    """Fetch every item; `log` is told each stage of the data build as it ends. With `ray_log`, Ray's own
    output (Ray Data's execution log included) goes to that file rather than the terminal."""
    return [
        _attempt("data (tokenize, pack, mix)", lambda: _data(study, output, log, ray_log)),
        *(_attempt(f"corpus {name}", lambda n=name: _corpus(n)) for name in _corpora(study)),
        *(_attempt(f"pretrained {s}", lambda s=s: _checkpoint(s)) for s in _hub_checkpoints(study)),
        *(_attempt(f"lm_eval {t}", lambda t=t: _lm_eval_task(t)) for t in _lm_eval_tasks(study)),
    ]


def _attempt(item: str, fetch: Callable[[], str]) -> Prepared:
    try:
        return Prepared(item, True, fetch())
    except Exception as exc:  # every item on its own: one unreachable dataset must not hide the others
        return Prepared(item, False, f"{type(exc).__name__}: {exc}")


def _data(study: Study, output: Path | str, log: Callable[[str], None], ray_log: Path | None) -> str:
    from rayb import runtime, storage
    from rayb.data.pipeline import prepare_data

    runtime.init_ray(ray_log)
    if ray_log is not None:
        log(f"Ray's own logs: {ray_log} (driver) and {runtime.session_logs()} (workers); -v shows them here")
    cache = prepare_data(study.data, storage.join(storage.resolve(output), "cache"), progress=log)
    m = cache.manifest
    return (
        f"{m['train_rows']:,} training and {m['val_rows']:,} validation rows of {m['seq_len']} tokens "
        f"({(m['train_rows'] + m['val_rows']) * m['seq_len'] / 1e6:,.1f}M tokens, {m['vocab_size']:,}-token "
        f"vocabulary) at {cache.path}"
    )


def _suites(study: Study, family: str) -> list[str]:
    return [s.partition(":")[2] for s in study.eval if s.partition(":")[0] == family and s.partition(":")[2]]


def _corpora(study: Study) -> list[str]:
    from rayb.eval.corpora import CORPORA

    return [name for name in _suites(study, "lm") if name in CORPORA]


def _corpus(name: str) -> str:
    from rayb.eval.corpora import corpora_dir, fetch_corpus

    local = corpora_dir() / f"{name}.txt"
    if local.exists():
        return f"already at {local}"
    return f"{len(fetch_corpus(name)):,} characters written to {local}"


def _hub_checkpoints(study: Study) -> list[str]:
    return sorted(
        {ref.source for m in study.models if (ref := m.checkpoint) is not None and ref.kind == "hub"}
    )


def _checkpoint(source: str) -> str:
    from huggingface_hub import snapshot_download

    return f"cached at {snapshot_download(source)}"


def _lm_eval_tasks(study: Study) -> list[str]:
    return [t for t in _suites(study, "lm_eval") if not t.startswith("rayb_")]  # rayb's own are generated


def _lm_eval_task(task: str) -> str:
    from rayb.eval.harness import lm_eval_tasks

    # Builds each of its tasks (a group's every one), and so loads (downloads) their datasets.
    tasks = lm_eval_tasks().load(task)["tasks"]
    return f"{len(tasks)} task(s) loaded into the datasets cache"
