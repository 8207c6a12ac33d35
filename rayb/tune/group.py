"""What runs on the cluster for each worker group of the pool (see packs.py): its Tune trainable, and the
queue its groups take their trials from.

Ray's processes import this module by name: each group's Tune actor to run `worker_group`, the queue's
actor, and every Train worker that takes a trial from the queue. It imports only what they need, since
each of those processes pays for its imports before its group trains (the driver's modules cost the
queue's actor four seconds of the two cores a laptop study starts on).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import deque

logger = logging.getLogger(__name__)


class TrialQueue:
    """The pool's trials still to train, a queue per group shape, and the trial each group holds: a group
    restarted after a failure (Ray Train's restart of its workers, or Tune's of a group lost with its node)
    is handed its trial again, to resume it. A Ray actor, named, on the driver's node.

    It also removes the placement group of a group whose Ray Train controller died without ending its run
    (lost with its Tune actor's node, or killed): such a placement group belongs to the job, not to the
    controller, and would hold its CPUs or GPUs from the restarted group until the study ends. Ray Train
    starts a detached actor per run for this (PlacementGroupCleanerCallback), a process of its own that
    asks the dashboard about its controller every second: per worker group, seconds of a laptop's two
    cores, and up to a second more at the run's end. The pool's queue does it once for all its groups,
    asking the GCS (see trainer.PoolCleaner)."""

    CHECK_S = 1.0  # how often the controllers' liveness is asked for

    def __init__(self, queues: dict[str, list[str]]):
        self.waiting = {shape: deque(keys) for shape, keys in queues.items()}
        self.held: dict[str, str] = {}  # {group (its run name): trial key}
        self.watched: dict[str, object] = {}  # {controller actor id: its worker group's placement group}
        self._watcher: threading.Thread | None = None

    def watch(self, controller: str, placement_group) -> None:
        """Remove `placement_group` if the controller dies before it `unwatch`es (a controller that starts
        another worker group registers that one's instead)."""
        self.watched[controller] = placement_group
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._remove_orphans, daemon=True)
            self._watcher.start()

    def unwatch(self, controller: str) -> None:
        self.watched.pop(controller, None)

    def _remove_orphans(self) -> None:
        from ray._private.state import actors
        from ray.util.placement_group import placement_group_table, remove_placement_group

        while True:
            time.sleep(self.CHECK_S)
            for controller, group in list(self.watched.items()):
                try:
                    if actors(controller).get("State") == "DEAD":
                        if placement_group_table(group).get("state") not in (None, "REMOVED"):
                            remove_placement_group(group)
                        self.watched.pop(controller, None)
                except Exception:  # the GCS unreachable for a moment: ask again next time
                    logger.warning("could not check controller %s", controller, exc_info=True)

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
