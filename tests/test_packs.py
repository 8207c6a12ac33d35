"""Which trials share a worker group of the pool, and how many groups train at once (pure logic, no Ray)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import tiny_study_dict

from rayb.study import StudyError, parse_study
from rayb.train.spec import TrainSpec
from rayb.train.trial import TrialPack, TrialSpec
from rayb.tune.packs import (
    Capacity,
    NodeType,
    groups_at_once,
    groups_fitting,
    groups_per_queue,
    makespan,
    one_node,
    trial_seconds,
    trial_slots,
    unfittable,
    worker_pool,
)


def _trials(models=("gpt2", "mamba"), lrs=(3e-3,), seeds=(0, 1, 2), **train) -> list[TrialSpec]:
    spec = TrainSpec(lr=list(lrs), **train)
    return [
        TrialSpec(key=f"{m}-{lr}-{s}", model=m, arch=m, model_config={"d_model": 32}, lr=lr, seed=s,
                  train=spec, steps=24, cache_dir="c", trial_dir=f"/nonexistent/{m}-{lr}-{s}", storage_path="r")
        for m in models for lr in lrs for s in seeds
    ]  # fmt: skip


def test_every_model_seed_and_learning_rate_shares_one_worker_group():
    (group,) = worker_pool(_trials(lrs=(1e-3, 3e-3)), slots=1, cores=2)
    assert [t.key for t in group.trials] == [f"{m}-{lr}-{s}" for m in ("gpt2", "mamba") for lr in (1e-3, 3e-3)
                                             for s in (0, 1, 2)]  # fmt: skip
    assert group.threads == 2  # one group at a time has both cores


def test_a_shape_gets_groups_to_fill_idle_slots_and_they_share_its_queue():
    assert [g.group for g in worker_pool(_trials(), slots=2, cores=2)] == [0, 1]
    assert [g.group for g in worker_pool(_trials(), slots=100, cores=2)] == [0, 1, 2, 3, 4, 5]
    one_model = worker_pool(_trials(models=("gpt2",)), slots=2, cores=2)
    assert [[t.seed for t in g.trials] for g in one_model] == [[0, 1, 2], [0, 1, 2]]  # one queue, two groups
    assert len({g.queue for g in one_model}) == 1 and len({g.run_name for g in one_model}) == 2
    assert {g.threads for g in one_model} == {1}  # two groups at once share the two cores
    # Two queues, of 3 trials and of a user's model's 1, on 4 slots: groups go where the queue is longest.
    (gpt2,) = _trials(models=("gpt2",), seeds=(0,))
    mine = TrialSpec(**{**gpt2.__dict__, "key": "mine", "model": "mine", "arch": "my_models:build"})
    shapes = [len(g.trials) for g in worker_pool(_trials(models=("mamba",)) + [mine], slots=4, cores=4)]
    assert shapes == [3, 3, 3, 1]
    assert groups_per_queue([5], 3) == [3] and groups_per_queue([2, 1], 8) == [2, 1]
    # Further groups go where a queue has the most trials per group.
    assert groups_per_queue([10, 10, 10], 8) == [3, 3, 2] and groups_per_queue([10, 2], 4) == [3, 1]


def test_the_costliest_trials_go_first_and_the_pool_ends_when_its_last_group_does():
    cheap, dear = (replace(t, train_flops_per_token=6e6) for t in _trials(models=("gpt2",), seeds=(0, 1)))
    dear = replace(dear, steps=cheap.steps * 10)
    (group,) = worker_pool([cheap, dear], slots=1, cores=1)
    assert [t.key for t in group.trials] == [dear.key, cheap.key]
    # Two groups on a queue of one long trial and three short: the long one first takes 3, the other group
    # trains the short ones meanwhile; in study order it would run alone at the end (1 + 3 = 4).
    assert makespan([[3, 1, 1, 1]], [2], slots=2) == 3 and makespan([[1, 1, 1, 3]], [2], slots=2) == 4
    # Groups beyond the slots start as others end; a group whose queue is empty by then ends at once.
    assert makespan([[1, 1], [5]], [1, 1], slots=1) == 7 and makespan([[2, 2, 2, 2]], [4], slots=2) == 4


def test_a_cpu_node_trains_as_many_groups_at_once_as_end_soonest_on_its_cores():
    two_cores = Capacity(({"CPU": 2.0},))

    # Trials of over a minute each, beside which a group's start is small.
    def seeds(n: int, **train) -> list[TrialSpec]:
        return [
            replace(t, train_flops_per_token=6e6) for t in _trials(models=("gpt2",), seeds=range(n), **train)
        ]

    def at_once(trials: list[TrialSpec], slots: int, capacity: Capacity) -> int:
        return groups_at_once(trials, slots, capacity, seq_len=1024)

    # 1.6x faster on two threads than on one: three seeds end sooner one by one on both cores (3 trials'
    # time) than two at once on one core each and then the third alone (2 x 1.6); two, four, five or ten
    # seeds sooner two at a time.
    assert [at_once(seeds(n), 2, two_cores) for n in (1, 2, 3, 4, 5, 10)] == [1, 2, 1, 2, 2, 2]
    (group,) = worker_pool(seeds(3), at_once(seeds(3), 2, two_cores), cores=2)
    assert group.threads == 2 and len(group.trials) == 3
    # Eight cores, ten seeds: four groups on two threads each (3 rounds / 1.6) beat eight on one (2 rounds)
    # and two on four (5 rounds / 2.3).
    assert at_once(seeds(10), 8, Capacity(({"CPU": 8.0},))) == 4
    # GPUs, nodes whose threads are each node's own, and an autoscaler: every slot.
    assert at_once(seeds(3, use_gpu=True), 2, Capacity(({"CPU": 8.0, "GPU": 2.0},))) == 2
    assert at_once(seeds(3), 2, Capacity(({"CPU": 1.0}, {"CPU": 1.0}))) == 2
    assert at_once(seeds(3), 2, Capacity(({"CPU": 2.0},), scales=True)) == 2
    assert at_once(seeds(3, max_concurrent_trials=2), 2, two_cores) == 2  # as the study asks


def test_trials_shorter_than_a_worker_groups_start_train_on_one_group():
    """The tiny test study's trials (24 steps of a 43K-parameter model: under half a second each) end
    sooner one after another than on a second group, whose start takes the cores for seconds; a second
    group pays once the trials are long enough."""
    two_cores = Capacity(({"CPU": 2.0},))
    tiny = [replace(t, train_flops_per_token=2.7e5) for t in _trials(global_batch=8)]
    assert trial_seconds(tiny[0], seq_len=32, threads=2) < 0.5
    assert groups_at_once(tiny, 2, two_cores, seq_len=32) == 1
    assert groups_at_once([replace(t, steps=t.steps * 200) for t in tiny], 2, two_cores, seq_len=32) == 2


def test_trials_that_need_another_worker_group_or_run_a_users_model_train_apart():
    (gpt2,) = _trials(models=("gpt2",), seeds=(0,))
    wide = TrialSpec(**{**gpt2.__dict__, "key": "wide", "model": "wide", "model_config": {"d_model": 64}})
    two_workers = TrialSpec(
        **{**gpt2.__dict__, "key": "two", "train": gpt2.train.model_copy(update={"num_workers": 2})}
    )
    mine = [TrialSpec(**{**gpt2.__dict__, "key": f"mine-{s}", "model": "mine", "arch": "my_models:build", "seed": s})
            for s in (0, 1)]  # fmt: skip
    pool = worker_pool([gpt2, mine[0], wide, two_workers, mine[1]], slots=1, cores=1)
    assert [[t.key for t in g.trials] for g in pool] == [[gpt2.key, "wide"], ["mine-0", "mine-1"], ["two"]]


def test_a_groups_run_name_is_stable_and_a_single_trial_keeps_its_own():
    trials = _trials(models=("gpt2",))
    assert TrialPack(tuple(trials)).run_name == TrialPack(tuple(_trials(models=("gpt2",)))).run_name
    assert TrialPack(tuple(trials)).run_name != TrialPack(tuple(trials[:2])).run_name
    assert TrialPack((trials[0],)).run_name == trials[0].run_name
    assert (
        TrialPack(tuple(trials), group=1).run_name
        == TrialPack(tuple(_trials(models=("gpt2",))), group=1).run_name
    )
    assert TrialPack(tuple(trials), group=1).run_name != TrialPack(tuple(trials), group=0).run_name
    for pack in (TrialPack(tuple(trials), threads=3), TrialPack(tuple(trials), group=2)):
        assert TrialPack.from_dict(pack.to_dict()) == pack


def test_slots_come_from_devices_and_gpu_shares():
    gpus = Capacity.of_gpus
    assert trial_slots(TrainSpec(use_gpu=True), gpus(8)) == 8
    assert trial_slots(TrainSpec(use_gpu=True, gpus_per_trial=0.25), gpus(8)) == 32
    assert trial_slots(TrainSpec(use_gpu=True, gpus_per_trial=0.3), gpus(1)) == 3
    assert trial_slots(TrainSpec(use_gpu=True, num_workers=8, global_batch=64), gpus(4)) == 1
    assert trial_slots(TrainSpec(max_concurrent_trials=3), gpus(64)) == 3


def test_slots_count_each_trials_real_resources_node_by_node():
    two_cores, four_cores = Capacity(({"CPU": 2.0},)), Capacity(({"CPU": 4.0},))
    assert trial_slots(TrainSpec(), two_cores) == 2  # a trial holds its worker's CPU, nothing more
    assert trial_slots(TrainSpec(), four_cores) == 4
    assert trial_slots(TrainSpec(num_workers=2, global_batch=32), Capacity(({"CPU": 5.0},))) == 2
    # A group that some node holds whole stays on one node: two 3-CPU nodes beside a 9-CPU one add none ...
    four_workers = TrainSpec(num_workers=4, global_batch=32)
    assert groups_fitting(four_workers, [({"CPU": 3.0}, 2), ({"CPU": 9.0}, 1)], on_one_node=True) == 2
    # ... and where no node holds it, it spreads: 6 CPUs on two nodes hold one 4-worker group.
    assert groups_fitting(four_workers, [({"CPU": 3.0}, 2)], on_one_node=False) == 1
    # GPUs limit a GPU study where CPUs do not: 8 GPUs and 96 CPUs per node hold 8 groups each.
    gpu_nodes = Capacity(({"CPU": 96.0, "GPU": 8.0}, {"CPU": 96.0, "GPU": 8.0}, {"CPU": 8.0}))
    assert trial_slots(TrainSpec(use_gpu=True), gpu_nodes) == 16
    # A cluster that scales up from no GPUs plans its trials side by side on the nodes it may launch.
    scaling = Capacity(({"CPU": 4.0},), (NodeType("gpu_a100x8", {"CPU": 96.0, "GPU": 8.0}, 4),), scales=True)
    assert trial_slots(TrainSpec(use_gpu=True), scaling) == 32
    # An autoscaler whose node types rayb cannot read: the trials run as the live nodes hold them.
    assert trial_slots(TrainSpec(use_gpu=True), Capacity(({"CPU": 4.0},), scales=True)) == 1


A100X8 = NodeType("gpu_a100x8", {"CPU": 96.0, "GPU": 8.0}, 2)
A10GX4 = NodeType("gpu_a10gx4", {"CPU": 48.0, "GPU": 4.0}, 3)


def test_placement_follows_the_nodes_the_cluster_has_or_can_launch():
    head = ({"CPU": 8.0},)
    eight = TrainSpec(use_gpu=True, num_workers=8, global_batch=64)
    six = TrainSpec(use_gpu=True, num_workers=6, global_batch=48)
    # 8 workers on 8-GPU nodes that the autoscaler will launch: one node each (NVLink).
    assert one_node(eight, Capacity(head, (A100X8,), scales=True))
    assert trial_slots(eight, Capacity(head, (A100X8,), scales=True)) == 2
    # 6 workers where the largest node has 4 GPUs: spread over two nodes, placed rather than refused.
    four_gpu_nodes = Capacity(head, (A10GX4,), scales=True)
    assert not one_node(six, four_gpu_nodes)
    assert unfittable(six, four_gpu_nodes) is None
    assert trial_slots(six, four_gpu_nodes) == 2  # 12 GPUs at most: two groups of six
    # The same on live nodes alone (a fixed cluster of two 4-GPU machines).
    live = Capacity(({"CPU": 48.0, "GPU": 4.0}, {"CPU": 48.0, "GPU": 4.0}))
    assert not one_node(six, live) and unfittable(six, live) is None and trial_slots(six, live) == 1
    # A live node that holds the group keeps it on one node, whatever else the cluster has.
    assert one_node(six, Capacity(({"CPU": 96.0, "GPU": 8.0}, {"CPU": 48.0, "GPU": 4.0})))
    # Node types rayb cannot read, and no live node that holds the group: it spreads (a group held to one
    # node that no node type has would wait forever).
    assert not one_node(eight, Capacity(head, scales=True))


def test_a_cluster_that_can_never_fit_a_trial_is_named_with_what_is_missing():
    four_workers = TrainSpec(num_workers=4, global_batch=32)
    why = unfittable(four_workers, Capacity(({"CPU": 2.0},)))
    assert "needs 4 CPU" in why and "have 2 CPU" in why and "train.num_workers" in why
    assert "no autoscaler" in why
    assert unfittable(four_workers, Capacity(({"CPU": 4.0},))) is None
    # A 1-CPU head whose autoscaler may add one 2-CPU node: 2 workers fit once it has, 4 never do.
    scaling = Capacity(({"CPU": 1.0},), (NodeType("cpu2", {"CPU": 2.0}, 1),), scales=True)
    assert unfittable(TrainSpec(num_workers=2, global_batch=32), scaling) is None
    why = unfittable(four_workers, scaling)
    assert "have 1 CPU" in why and "node types (cpu2: 2 CPU, at most 1)" in why
    # An autoscaler whose node types rayb cannot read may add anything: nothing is refused.
    assert unfittable(four_workers, Capacity(({"CPU": 1.0},), scales=True)) is None
    why = unfittable(TrainSpec(use_gpu=True), Capacity(({"CPU": 8.0},)))
    assert "1 GPU" in why and "0 GPU" in why
    # The shipped cloud clusters start with no GPU node: a GPU study waits for the autoscaler's.
    assert unfittable(TrainSpec(use_gpu=True), Capacity(({"CPU": 8.0},), (A100X8,), scales=True)) is None


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ({"gpus_per_trial": 0.5}, "set use_gpu: true"),
        ({"use_gpu": True, "num_workers": 2, "gpus_per_trial": 0.5}, "needs num_workers: 1"),
        ({"use_gpu": True, "gpus_per_trial": 2}, "set num_workers: 2 instead"),
    ],
)
def test_a_gpu_share_that_cannot_be_placed_is_refused(train, message):
    raw = tiny_study_dict()
    raw["train"] |= train
    with pytest.raises(StudyError, match=message):
        parse_study(raw)


def test_scheduling_settings_leave_trial_keys_alone():
    base = tiny_study_dict()
    shared = tiny_study_dict()
    shared["train"] |= {"use_gpu": True, "gpus_per_trial": 0.25, "max_concurrent_trials": 4}
    gpu = tiny_study_dict()
    gpu["train"] |= {"use_gpu": True}
    a, b, c = (parse_study(s) for s in (base, shared, gpu))
    assert b.trial_key(b.models[0], 3e-3, 0, "data") == c.trial_key(c.models[0], 3e-3, 0, "data")
    assert a.trial_key(a.models[0], 3e-3, 0, "data") != c.trial_key(c.models[0], 3e-3, 0, "data")


def test_plan_shows_how_trials_pack_onto_the_gpus(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from rayb.cli import app
    from rayb.plan import plan_study

    raw = tiny_study_dict(seeds=10)
    raw["train"] |= {"use_gpu": True, "gpus_per_trial": 0.25}
    plan = plan_study(parse_study(raw), peak_flops=312e12, mfu=0.4)
    packing = plan.packing(gpus=1)
    assert packing.slots == 4 and packing.groups == [4] and len(packing.queues[0]) == 20
    assert packing.describe() == "(gpt2 ×10, mamba ×10) by 4 groups"
    assert plan.packing(gpus=8).groups == [20]  # 32 slots: one group per trial
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["plan", str(tmp_path / "study.yaml"), "--gpus", "1"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "On 1 GPUs, 4 worker groups take trials from 1 queue: (gpt2 ×10, mamba ×10) by 4 groups" in text
    assert "4 groups at once (4 fit, 4 to a GPU)" in text


@pytest.mark.parametrize("suites", [["lm"], ["lm", "speed"]])
def test_spare_cpus_and_free_cores_are_those_no_group_with_a_trial_left_uses(tmp_path, suites):
    """On a 2-core node, two groups share a queue of four trials: no CPU is spare, and no core free of
    training's threads, while two trials are unfinished; with one left, one group has ended and its core is
    both; none need be spare once training is over, when evaluation has every core (no limit of the
    feed's: None). Except where every suite may run on a drained Train worker (not speed, which measures its
    process): once every group trains its last trial, its own workers evaluate, holding their cores, so none
    is spare. One group of one seed holds one Ray CPU but trains on both cores: neither is spare or free.
    Before the study's first pool starts, no core is free: its groups are about to take them."""
    import json

    from rayb.eval.feed import FinishedTrials
    from rayb.train.trial import TRAIN_DONE

    study = parse_study(tiny_study_dict(eval=suites))
    drained_workers_evaluate = suites == ["lm"]
    trials = [replace(t, trial_dir=str(tmp_path / t.key)) for t in _trials(seeds=(0, 1))]
    one_node = Capacity(({"CPU": 2.0},))
    training = object()  # what runner.run_study sets while a worker pool trains (its DrainedWorkers)

    def feed_of(trials: list[TrialSpec], capacity: Capacity, slots: int) -> FinishedTrials:
        feed = FinishedTrials(study, trials, capacity)
        feed.pool, feed.slots, feed.workers = (
            worker_pool(trials, slots, int(capacity.nodes[0]["CPU"])),
            slots,
            training,
        )
        return feed

    feed = feed_of(trials, one_node, slots=2)
    assert len(feed.pool) == 2

    def finish(trial: TrialSpec) -> None:
        Path(trial.trial_dir).mkdir()
        Path(trial.trial_dir, TRAIN_DONE).write_text(json.dumps({"status": "failed"}))
        feed()

    assert (feed.spare_cpus(), feed.free_cores()) == (0, 0)
    for trial in trials[:2]:
        finish(trial)
        assert (feed.spare_cpus(), feed.free_cores()) == (0, 0)  # both groups still have a trial to train
    finish(trials[2])
    assert (feed.spare_cpus(), feed.free_cores()) == (0 if drained_workers_evaluate else 1, 1)
    feed.workers = None
    assert feed.free_cores() is None  # no worker pool trains
    feed.workers = training
    feed.training_over.set()
    assert feed.free_cores() is None
    feed.training_over.clear()
    finish(trials[3])
    assert (feed.spare_cpus(), feed.free_cores()) == (0, None)  # nothing trains: no actor need wait

    # Before the study's first pool starts: its groups are about to take the cores.
    feed = FinishedTrials(study, trials, one_node)
    feed.pool_ahead = True
    assert (feed.spare_cpus(), feed.free_cores()) == (0, 0)
    feed.training_over.set()
    assert feed.free_cores() is None

    feed = feed_of(trials[:1], one_node, slots=2)
    assert feed.pool[0].threads == 2
    assert (feed.spare_cpus(), feed.free_cores()) == (0, 0)  # one seed on two cores
    feed = feed_of(trials[:1], Capacity(({"CPU": 3.0},)), slots=3)
    assert (feed.spare_cpus(), feed.free_cores()) == (0, 0)  # on three threads
    feed = feed_of(trials[:2], Capacity(({"CPU": 3.0},)), slots=2)
    assert feed.pool[0].threads == 1  # two groups on three cores: one core left for evaluation
    assert (feed.spare_cpus(), feed.free_cores()) == (0 if drained_workers_evaluate else 1, 1)
    feed = feed_of(trials[:1], Capacity(({"CPU": 2.0}, {"CPU": 2.0})), slots=4)
    # Actors there could split what a group needs on one node, and Ray places them: its count is the limit.
    assert (feed.spare_cpus(), feed.free_cores()) == (0, None)


def test_the_pools_queue_hands_each_trial_to_one_group_and_a_restarted_group_its_own_again():
    from rayb.tune.group import TrialQueue

    queue = TrialQueue({"gpt2": ["a", "b", "c"], "mine": ["m0", "m1"]})
    assert queue.take("gpt2", "g0") == "a" and queue.take("gpt2", "g1") == "b"
    assert queue.take("gpt2", "g0") == "a"  # restarted before it finished: its trial again, to resume
    assert queue.take("gpt2", "g0", finished="a") == "c"
    assert queue.take("gpt2", "g1", finished="b") is None  # the queue is empty: the group ends
    assert queue.take("gpt2", "g0", finished="c") is None
    # A group that fails for good takes its shape's waiting trials with it, and no other shape's.
    assert queue.take("mine", "u0") == "m0"
    assert queue.fail("mine", "u0") == ("m0", ["m1"])
    assert queue.take("mine", "u0") is None and queue.fail("gpt2", "g0") == (None, [])


def test_the_queue_relays_jobs_to_drained_workers_only_once_no_trial_waits_and_until_released():
    import threading

    from rayb.tune.group import WAIT, TrialQueue

    queue = TrialQueue({"gpt2": ["a", "b"]})
    assert queue.take("gpt2", "g0") == "a"
    assert queue.take("gpt2", "g1") == "b"
    assert queue.job_for("w0") is None  # no eval pool has asked for jobs: a drained worker goes
    queue = TrialQueue({"gpt2": ["a", "b"]})
    assert queue.take("gpt2", "g0") == "a"
    assert not queue.relay_state()["drained"]
    assert queue.job_for("w0") is None  # a trial still waits for a group: a worker with none goes
    assert queue.evaluate(b"job") is None  # no worker free: the pool runs it on an actor instead
    seen = queue.relay_state()["version"]
    assert queue.changed(seen, timeout_s=0.05) == seen  # nothing moved: the eval pool's wait times out
    assert queue.take("gpt2", "g1") == "b"
    version = queue.changed(seen, timeout_s=60)  # a trial taken wakes the eval pool at once
    assert version > seen and queue.relay_state() == {
        "version": version, "free": 0, "busy": 0, "released": False, "drained": True, "finished": False,
        "groups": 0,
    }  # fmt: skip
    assert queue.job_for("w0") == WAIT and queue.relay_state()["free"] == 1
    result: list = []
    evaluation = threading.Thread(target=lambda: result.append(queue.evaluate(b"job")))
    evaluation.start()
    while queue.relay_state()["busy"] == 0:
        time.sleep(0.01)
    assert queue.job_for("w0") == b"job" and queue.relay_state()["free"] == 0
    queue.done("w0", {"status": "ok"})
    evaluation.join()
    assert result == [{"status": "ok"}] and queue.relay_state()["busy"] == 0
    assert queue.take("gpt2", "g0", finished="a") is None and queue.take("gpt2", "g1", finished="b") is None
    assert queue.relay_state()["finished"] and queue.job_for("w0") == WAIT
    evaluation = threading.Thread(target=lambda: result.append(queue.evaluate(b"last")))
    evaluation.start()
    while queue.relay_state()["busy"] == 0:
        time.sleep(0.01)
    queue.release()  # after the last job was handed to w0, before w0 asked again: it still runs it
    assert queue.job_for("w0") == b"last"
    queue.done("w0", {"status": "ok"})
    evaluation.join()
    assert result[-1] == {"status": "ok"}
    assert queue.job_for("w0") is None and queue.job_for("w1") is None and queue.evaluate(b"job") is None


def test_a_free_drained_workers_ask_waits_for_its_job_not_its_poll():
    import threading

    from rayb.tune.group import WAIT, TrialQueue

    queue = TrialQueue({"gpt2": []})
    queue.relay_state()  # an eval pool asks: the relay is open
    began = time.monotonic()
    assert queue.job_for("w0") == WAIT and time.monotonic() - began >= TrialQueue.ASK_S * 0.9
    asked = threading.Thread(target=lambda: queue.evaluate(b"job"))
    began = time.monotonic()
    threading.Timer(0.3, asked.start).start()
    assert queue.job_for("w0") == b"job" and time.monotonic() - began < TrialQueue.ASK_S * 0.9
    queue.done("w0", {"status": "ok"})
    asked.join()


def test_what_the_pools_processes_import_leaves_out_the_drivers_modules():
    """The queue's actor, each group's Train controller and every Train worker import the pool's modules by
    name before their group trains: neither the queue's module nor the controller's may pull in torch, nor
    the controller's the training loop, the statistics (scipy) or the study model."""
    import subprocess
    import sys

    probe = (
        "import sys, rayb.tune.group; queue = sorted(m for m in ('torch', 'scipy') if m in sys.modules); "
        "import rayb.train.trainer; "
        "controller = sorted(m for m in ('torch', 'rayb.train.loop', 'scipy', 'rayb.study', 'transformers') if m in sys.modules); "
        "print(queue, controller)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[0] == "[] []", done.stdout
