"""Data preparation reads only the shards its token budget needs: a DCLM-like directory of many small
parquet files costs time in proportion to the shards used, not the shards present.

In one run: the same corpus split into N small shards, for N = 100 and 10,000 (the same first
documents, so the same shards are used), prepared with the same small token budget. It prints, for each,
the shards present, the shards rayb opened (from the cache manifest) and the wall time of
`prepare_data`, and the ratio of the two times (1.0 means the 9,900 unused shards cost nothing).

    python bench/shards.py                 # 100 and 10,000 shards
    python bench/shards.py --shards 100 2000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rayb import runtime
from rayb.data.pipeline import prepare_data
from rayb.data.sources import resolve
from rayb.study import parse_study

DOCS_PER_SHARD = 20


def write_shards(texts: list[str], shards: int, out: Path) -> Path:
    """`shards` parquet files of DOCS_PER_SHARD documents each, cycling through `texts`, in order."""
    out.mkdir(parents=True)
    for i in range(shards):
        docs = [texts[(i * DOCS_PER_SHARD + j) % len(texts)] for j in range(DOCS_PER_SHARD)]
        pq.write_table(pa.table({"text": docs}), out / f"part-{i:05d}.parquet")
    return out


def data_spec(shard_dir: Path, token_budget: int):
    raw = {
        "version": 1,
        "name": "shards-bench",
        "data": {
            "sources": [{"name": "dclm", "uri": str(shard_dir), "weight": 1.0}],
            "tokenizer": "bpe:1024", "seq_len": 128, "token_budget": token_budget, "val_share": 0.05,
        },
        "models": [{"arch": "gpt2", "config": {"d_model": 64, "n_layer": 1, "n_head": 1}}],
    }  # fmt: skip
    return parse_study(raw).data


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", type=int, nargs="+", default=[100, 10_000])
    parser.add_argument("--token-budget", type=int, default=128 * 320)
    args = parser.parse_args()
    runtime.init_ray()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        source = resolve("embedded://web?docs=2000", root / "embedded")
        texts = pq.read_table(source.paths[0]).column("text").to_pylist()
        timings = {}
        print(f"{'shards present':>15} {'shards read':>12} {'prepare_data (s)':>17}")
        for shards in args.shards:
            spec = data_spec(write_shards(texts, shards, root / f"shards-{shards}"), args.token_budget)
            prepare_data(spec, root / f"warm-{shards}")  # tokenizer trained, Ray Data warm: not timed
            began = time.perf_counter()
            cache = prepare_data(spec.model_copy(update={"seed": 1}), root / f"cache-{shards}")
            timings[shards] = time.perf_counter() - began
            counts = cache.manifest["sources"]["dclm"]
            print(f"{counts['shards_present']:>15,} {counts['shards_read']:>12,} {timings[shards]:>17.2f}")
        low, high = min(timings), max(timings)
        print(f"time with {high:,} shards present / with {low:,}: {timings[high] / timings[low]:.2f}x")


if __name__ == "__main__":
    main()
