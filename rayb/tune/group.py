"""What runs on the cluster for each worker group of the pool (see packs.py): its Tune trainable, and the
queue its groups take their trials from.

Ray's processes import this module by name: each group's Tune actor to run `worker_group`, the queue's
actor, and every Train worker that takes a trial from the queue. It imports only what they need, since
each of those processes pays for its imports before its group trains (the driver's modules cost the
queue's actor four seconds of the two cores a laptop study starts on).
"""

from __future__ import annotations

import traceback
from collections import deque


class TrialQueue:
    """The pool's trials still to train, a queue per group shape, and the trial each group holds: a group
    restarted after a failure (Ray Train's restart of its workers, or Tune's of a group lost with its node)
    is handed its trial again, to resume it. A Ray actor, named, on the driver's node."""

    def __init__(self, queues: dict[str, list[str]]):
        self.waiting = {shape: deque(keys) for shape, keys in queues.items()}
        self.held: dict[str, str] = {}  # {group (its run name): trial key}

    def take(self, shape: str, group: str, finished: str | None = None) -> str | None:
        """The group's next trial (None once its queue is empty), after the one it `finished`."""
        if finished is not None and self.held.get(group) == finished:
            del self.held[group]
        if group not in self.held and self.waiting[shape]:
            self.held[group] = self.waiting[shape].popleft()
        return self.held.get(group)

    def fail(self, shape: str, group: str) -> tuple[str | None, list[str]]:
        """A group that failed for good: the trial it held, and its shape's waiting trials, which go untrained
        with it (as a user's model that crashes would crash in each of its trials)."""
        waiting, self.waiting[shape] = list(self.waiting[shape]), deque()
        return self.held.pop(group, None), waiting


def worker_group(config: dict) -> None:
    """Run one worker group of the pool, as a Tune trial. Its only report to Tune is its last: every trial
    writes its own results (see `rayb.train.trial`), and a Tune trial that ends having reported nothing
    prints a line on the user's terminal. A failure Ray Train has already retried is final, so it ends the
    Tune trial normally instead of raising, which Tune would retry, and reports the trials it leaves
    untrained."""
    import ray
    from ray import tune
    from ray.train import TrainingFailedError

    from rayb.train.trainer import pack_trainer
    from rayb.train.trial import TrialPack

    pack = TrialPack.from_dict(config["pack"])
    try:
        pack_trainer(pack, one_node=config["one_node"], queue=config["queue"]).fit()
    except TrainingFailedError as exc:
        held, waiting = ray.get(ray.get_actor(config["queue"]).fail.remote(pack.queue, pack.run_name))
        error = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        tune.report(error | {"held": held, "waiting": waiting})
    else:
        tune.report({"failed": False})  # not None: Tune prints a last result with no values shown
