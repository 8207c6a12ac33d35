"""Data preparation throughput: rayb's Ray Data pipeline against a bare `tokenizers.encode_batch`.

For corpora of growing size (rayb's embedded edu source), in one run on this machine's cores:
- rayb: `prepare_data` into a fresh cache (tokenize, pack, mix, write, held-out record), with the
  study's tokenizer already trained and Ray already started, so only the per-corpus work is timed;
- bare: one process reads the same parquet text and tokenizes all of it with `encode_batch` (the Rust
  tokenizer uses every core), with no packing or writing;
- the ratio, and how far the driver's resident memory rose during rayb's preparation (sampled every
  20 ms). Tokens never pass through the driver; what it does hold is the held-out record (the text
  behind the validation rows, a fixed share of the budget), whose size is printed beside it.

    python bench/data_prep.py                   # 3,000, 12,000 and 48,000 documents (1.5, 6, 24 MB)
    python bench/data_prep.py --docs 3000 100000
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq

from rayb import runtime
from rayb.data.held_out import HELD_OUT_DIR
from rayb.data.pipeline import _fast_tokenizer, prepare_data
from rayb.data.sources import resolve
from rayb.study import parse_study

SEQ_LEN = 128


def data_spec(docs: int, token_budget: int):
    raw = {
        "version": 1,
        "name": "data-bench",
        "data": {
            "sources": [{"name": "edu", "uri": f"embedded://edu?docs={docs}", "weight": 1.0}],
            "tokenizer": "bpe:2048", "seq_len": SEQ_LEN, "token_budget": token_budget, "val_share": 0.05,
        },
        "models": [{"arch": "gpt2", "config": {"d_model": 64, "n_layer": 1, "n_head": 1}}],
    }  # fmt: skip
    return parse_study(raw).data


def bare_encode(paths: list[str], tokenizer_dir: Path) -> tuple[float, int]:
    """Read the text and tokenize all of it in this process: (seconds, tokens)."""
    began = time.perf_counter()
    tokenizer = _fast_tokenizer(str(tokenizer_dir))
    tokens = 0
    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024, columns=["text"]):
            tokens += sum(len(e.ids) + 1 for e in tokenizer.encode_batch(batch.column(0).to_pylist()))
    return time.perf_counter() - began, tokens


def measure(docs: int, root: Path) -> dict:
    paths = resolve(f"embedded://edu?docs={docs}", root).paths
    # A first, small preparation trains the tokenizer (keyed by the source, so shared with the run below).
    tokenizer_dir = prepare_data(data_spec(docs, SEQ_LEN * 64), root).tokenizer_dir
    bare_s, tokens = bare_encode(paths, tokenizer_dir)
    budget = int(tokens * 0.9 / 1.05) // SEQ_LEN * SEQ_LEN  # nearly all of it, after validation rows
    with RssRise() as rise:
        began = time.perf_counter()
        cache = prepare_data(data_spec(docs, budget), root)
        rayb_s = time.perf_counter() - began
    held_out_mb = sum(f.stat().st_size for f in (cache.path / HELD_OUT_DIR).rglob("*")) / 2**20
    shutil.rmtree(cache.path)  # the next size starts from nothing but its tokenizer
    return {
        "docs": docs,
        "tokens": tokens,
        "rayb_s": rayb_s,
        "bare_s": bare_s,
        "driver_rise_mb": rise.mb,
        "held_out_mb": held_out_mb,
    }


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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=int, nargs="+", default=[3000, 12000, 48000])
    args = parser.parse_args()
    runtime.init_ray()
    cores = runtime.compute_cores(False)
    with tempfile.TemporaryDirectory(prefix="rayb-data-bench-") as work:
        rows = [measure(docs, Path(work)) for docs in args.docs]
    print(f"\nData preparation on {cores} cores (rayb: Ray Data tasks; bare: encode_batch in one process)")
    print(f"{'docs':>8} {'tokens':>11} {'rayb s':>8} {'rayb tok/s':>11} {'bare s':>7} {'bare tok/s':>11} "
          f"{'rayb/bare':>9} {'driver +MB':>11} {'held-out MB':>11}")  # fmt: skip
    for r in rows:
        print(
            f"{r['docs']:>8,} {r['tokens']:>11,} {r['rayb_s']:>8.2f} {r['tokens'] / r['rayb_s']:>11,.0f} "
            f"{r['bare_s']:>7.2f} {r['tokens'] / r['bare_s']:>11,.0f} {r['rayb_s'] / r['bare_s']:>8.2f}x "
            f"{r['driver_rise_mb']:>11.1f} {r['held_out_mb']:>11.1f}"
        )


if __name__ == "__main__":
    main()
