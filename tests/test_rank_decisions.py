"""What every rank must agree on, rank 0 decides: two real gloo ranks (processes) that see storage
differently (an NFS or EFS cache after a restart) still train the same trials and reduce the same metrics."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from types import SimpleNamespace

from conftest import tiny_study_dict

from rayb.study import parse_study
from rayb.train.trial import TRAIN_DONE, TrialPack, TrialSpec


def _pack(root: Path) -> TrialPack:
    train = parse_study(tiny_study_dict()).train
    return TrialPack(
        tuple(
            TrialSpec(
                key=key,
                model="gpt2",
                arch="gpt2",
                model_config={},
                lr=1e-3,
                seed=0,
                train=train,
                steps=1,
                cache_dir=str(root),
                trial_dir=str(root / key),
                storage_path=str(root / "ray"),
            )  # fmt: skip
            for key in ("a", "b", "c")
        )
    )


class _Model:
    """A model whose own metrics differ in number by rank (a metric a rank has not seen yet)."""

    def __init__(self, rank: int):
        self.rank = rank

    def extra_metrics(self) -> dict[str, float]:
        return {"load": 1.0 + self.rank} | ({"drops": 4.0} if self.rank == 1 else {})


def _rank(rank: int, root: Path, results) -> None:
    import torch.distributed as dist

    from rayb.train.collectives import HostCollectives
    from rayb.train.loop import _extra_metrics, trials_to_train

    dist.init_process_group("gloo", init_method=f"file://{root / 'store'}", rank=rank, world_size=2)
    if rank == 1:  # a stale listing: this rank sees no trial finished
        TrialSpec.done = property(lambda trial: False)
    comm = HostCollectives()
    remaining = [t.key for t in trials_to_train(_pack(root), comm, queue=None)]
    run = SimpleNamespace(engine=SimpleNamespace(module=_Model(rank)), comm=comm, rank=rank)
    results.put((rank, remaining, _extra_metrics(run)))
    dist.destroy_process_group()


def test_ranks_that_see_storage_differently_follow_rank_0(tmp_path):
    for key in ("a", "b"):
        (tmp_path / key).mkdir()
    (tmp_path / "a" / TRAIN_DONE).write_text("{}")  # rank 0 sees "a" finished; rank 1 (below) does not
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    ranks = [context.Process(target=_rank, args=(r, tmp_path, results)) for r in (0, 1)]
    for process in ranks:
        process.start()
    try:
        got = dict(
            (rank, (remaining, extra)) for rank, remaining, extra in (results.get(timeout=120) for _ in ranks)
        )
    finally:
        for process in ranks:
            process.join(timeout=10)
            process.kill()
    assert got[0] == got[1] == (["b", "c"], {"load": 1.5}), got
