"""A Train worker's and an eval actor's imports are left out of Python's garbage collections
(rayb.imports_frozen), and what their trials and jobs make afterwards is still collected."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROBE = textwrap.dedent(
    """
    import gc, json, weakref
    import torch
    before = gc.get_freeze_count()
    {start}
    frozen = gc.get_freeze_count() - before

    class Node:  # a trial's model and engine hold reference cycles like this one
        pass

    a, b = Node(), Node()
    a.other, b.other, a.weights = b, a, torch.zeros(1 << 20)
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    print(json.dumps({{"frozen": frozen, "enabled": gc.isenabled(), "cycle_freed": gone() is None}}))
    """
)


def _probe(start: str) -> dict:
    import json

    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(start=start)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_train_workers_imports_are_frozen_and_a_trials_cycles_still_collected():
    probe = _probe("from rayb.train.loop import import_worker_libraries; import_worker_libraries(False)")
    assert probe["frozen"] > 100_000  # torch's, DeepSpeed's, transformers' objects
    assert probe["enabled"] and probe["cycle_freed"]


def test_an_eval_actors_imports_are_frozen_and_a_jobs_cycles_still_collected():
    probe = _probe("from rayb.eval.actors import _EvalActor; _EvalActor(threads=1)")
    assert probe["frozen"] > 100_000
    assert probe["enabled"] and probe["cycle_freed"]
