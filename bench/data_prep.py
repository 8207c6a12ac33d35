"""Data preparation throughput: rayb's Ray Data pipeline against the raw floor, `tokenizers.encode_batch`.

On a corpus built here (rayb's embedded edu source: no hub; about 1.45 KB a document, so 180,000 documents
are about 260 MB of text), for each token budget, in one run on this machine's cores:
- rayb: `prepare_data` into a fresh cache (tokenize, hold out, pack, place, write, held-out record), with
  the study's tokenizer already trained and Ray already started, so only the per-corpus work is timed;
- bare: one process reads the same parquet in order and tokenizes it with `encode_batch` (the Rust
  tokenizer uses every core) until the training and validation streams have the budget's tokens: the
  fewest documents any preparation must tokenize, and nothing else;
- the ratio of the wall-clocks (rayb's includes any documents it read beyond that), and how far the driver's resident memory rose during rayb's preparation (sampled every
  20 ms): tokens never pass through the driver, so it should not grow with the budget;
- where rayb's time went: the wall-clock of each stage, and inside the tokenize stage the seconds its
  tasks spent reading parquet, drawing the held-out split, tokenizing, packing into streams and writing
  (summed over tasks, so they add up to about cores x the stage's wall-clock).

    python bench/data_prep.py                                  # 7.5M and 30M tokens, seq_len 1024, BPE 16k
    python bench/data_prep.py --docs 20000 --budgets 4000000   # a quick look
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq

from rayb import runtime
from rayb.data.pipeline import _tokenizer, prepare_data
from rayb.data.sources import resolve
from rayb.data.tasks import fast_tokenizer
from rayb.study import parse_study

TASK_PARTS = ("read_s", "held_out_s", "tokenize_s", "pack_s", "write_s")


def data_spec(docs: int, token_budget: int, seq_len: int, vocab: int):
    raw = {
        "version": 1,
        "name": "data-bench",
        "data": {
            "sources": [{"name": "edu", "uri": f"embedded://edu?docs={docs}", "weight": 1.0}],
            "tokenizer": f"bpe:{vocab}", "seq_len": seq_len, "token_budget": token_budget, "val_share": 0.05,
        },
        "models": [{"arch": "gpt2", "config": {"d_model": 64, "n_layer": 1, "n_head": 1}}],
    }  # fmt: skip
    return parse_study(raw).data


def bare_encode(paths: list[str], tokenizer_dir: Path, spec) -> tuple[float, int, int]:
    """The floor: read documents in order and tokenize them in this process until the training and the
    validation stream hold the tokens the budget asks for: (seconds, documents, tokens with EOS)."""
    began = time.perf_counter()
    tokenizer = fast_tokenizer((tokenizer_dir / "tokenizer.json").read_text())
    need = {False: spec.train_rows * spec.seq_len, True: spec.val_rows * spec.seq_len}
    have, docs = {False: 0, True: 0}, 0
    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=500, columns=["text"]):
            texts = batch.column(0).to_pylist()
            for text, encoding in zip(
                texts, tokenizer.encode_batch(texts, add_special_tokens=False), strict=True
            ):
                have[spec.held_out.held(text)] += len(encoding.ids) + 1
            docs += len(texts)
            if all(have[h] >= need[h] for h in need):
                return time.perf_counter() - began, docs, sum(have.values())
    raise ValueError("the corpus is too small for the budget")


def measure(spec, root: Path) -> dict:
    paths = resolve(spec.sources[0].location, root).paths
    with RssRise() as rise:
        began = time.perf_counter()
        cache = prepare_data(spec, root, progress=lambda line: print("  rayb", line))
        rayb_s = time.perf_counter() - began
    stages = cache.manifest["build_stages"]
    bare_s, bare_docs, bare_tokens = bare_encode(paths, cache.tokenizer_dir, spec)
    shutil.rmtree(cache.path)  # the next budget starts from nothing but the corpus and its tokenizer
    return {"budget": spec.token_budget, "docs": stages["tokenize"]["docs"], "tokens": stages["tokenize"]["tokens"],
            "rayb_s": rayb_s, "bare_docs": bare_docs, "bare_tokens": bare_tokens, "bare_s": bare_s,
            "driver_rise_mb": rise.mb, "stages": stages}  # fmt: skip


class RssRise:
    """The most this process's resident memory rose above its level at the start of the block."""

    def __init__(self):
        self.process, self.peak, self.done = psutil.Process(), 0, threading.Event()

    def __enter__(self):
        self.start = self.peak = self.process.memory_info().rss
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.done.wait(0.02):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()
        self.mb = (self.peak - self.start) / 2**20


def print_table(rows: list[dict], cores: int, corpus_mb: float) -> None:
    print(f"\nData preparation on {cores} cores from a {corpus_mb:,.0f} MB corpus "
          "(rayb: Ray Data tasks; bare: encode_batch in one process, same documents)")  # fmt: skip
    print(f"{'budget':>11} {'rayb docs':>9} {'rayb tokens':>11} {'rayb s':>7} {'rayb tok/s':>11} "
          f"{'bare docs':>9} {'bare tokens':>11} {'bare s':>7} {'bare tok/s':>11} {'rayb/bare':>9} {'driver +MB':>10}")  # fmt: skip
    for r in rows:
        print(
            f"{r['budget']:>11,} {r['docs']:>9,} {r['tokens']:>11,} {r['rayb_s']:>7.2f} "
            f"{r['tokens'] / r['rayb_s']:>11,.0f} {r['bare_docs']:>9,} {r['bare_tokens']:>11,} {r['bare_s']:>7.2f} "
            f"{r['bare_tokens'] / r['bare_s']:>11,.0f} {r['rayb_s'] / r['bare_s']:>8.2f}x {r['driver_rise_mb']:>10.1f}"
        )
    print("\nrayb's time split: stage wall-clock s | inside tokenize, task-seconds per part")
    print(
        f"{'budget':>11} {'tokenize':>8} {'place':>6} {'held-out':>8} | "
        + " ".join(f"{p[:-2]:>8}" for p in TASK_PARTS)
    )
    for r in rows:
        s = r["stages"]
        print(f"{r['budget']:>11,} {s['tokenize']['s']:>8.2f} {s['place']['s']:>6.2f} "
              f"{s['held-out record']['s']:>8.2f} | " + " ".join(f"{s['tokenize'][p]:>8.2f}" for p in TASK_PARTS))  # fmt: skip


def text_bytes(path: str) -> int:
    """The text a parquet shard holds, uncompressed."""
    meta = pq.ParquetFile(path).metadata
    return sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=180_000, help="corpus size in documents")
    parser.add_argument("--budgets", type=int, nargs="+", default=[7_500_000, 30_000_000])
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument(
        "--work", type=Path, help="keep the corpus and tokenizer here (default: a temporary dir)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rayb-data-bench-") as work:
        root = args.work or Path(work)
        runtime.init_ray(root / "ray-driver.log")  # Ray's own log off the terminal, as `rayb data prepare`
        cores = runtime.compute_cores(False)
        specs = [data_spec(args.docs, budget, args.seq_len, args.vocab) for budget in args.budgets]
        began = time.perf_counter()
        resolved = {s.name: resolve(s.location, root) for s in specs[0].sources}
        corpus_mb = sum(text_bytes(p) for p in resolved["edu"].paths) / 2**20
        print(
            f"corpus: {args.docs:,} documents, {corpus_mb:,.0f} MB of text in {time.perf_counter() - began:.0f} s"
        )
        began = time.perf_counter()
        _tokenizer(specs[0], resolved, root)  # shared by every budget (keyed by the source)
        print(f"tokenizer: bpe:{args.vocab} trained in {time.perf_counter() - began:.0f} s")
        rows = [measure(spec, root) for spec in specs]
    print_table(rows, cores, corpus_mb)
    print("\n" + json.dumps(rows))


if __name__ == "__main__":
    main()
