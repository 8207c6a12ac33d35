"""The queue the worker groups of the pool (see packs.py) take their trials from.

Ray's processes import this module by name: the queue's actor, and every Train worker that takes a trial
from the queue. It imports only what they need, since each of those processes pays for its imports before
its group trains (the driver's modules cost the queue's actor four seconds of the two cores a laptop
study starts on).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque

import ray

WAIT = "wait"  # a drained worker's answer while no evaluation job has been relayed to it yet


class TrialQueue:
    """The pool's trials still to train, a queue per group shape, and the trial each group holds: a group
    restarted after a failure (Ray Train's restart of its workers, or the driver's of a run whose controller
    died) is handed its trial again, to resume it. A Ray actor, named, on the driver's node.

    It knows each running group's Ray Train controller, to end them all when the pool stops (a cluster
    that can never fit a trial: sweep.ClusterWatch). It also removes the placement groups of a controller
    that died without ending its run (killed), or that it ended: such a placement group belongs to the job,
    not to the controller, and would hold its CPUs or GPUs from the restarted group until the study ends
    (or, pending, take them once they are free). Ray Train starts a detached actor per run for this
    (PlacementGroupCleanerCallback), a process of its own that asks the dashboard about its controller
    every second: per worker group, seconds of a laptop's two cores, and up to a second more at the run's
    end. The pool's queue does it once the driver, whose call to the controller fails as it dies, says so
    (`lost`: see trainer.PackTrainer); where the driver dies, the job's placement groups and actors go with
    it.

    It hands out the Train workers the driver started ahead for its groups on rayb's private instance
    (kept.start_warm_workers), and kills those a group adopted once that group's controller is gone:
    they are the driver's actors, not the controller's, and so do not die with it as its own workers would.
    A trial is handed on to a restarted group only once no such worker of an earlier run is left to train it.
    An adopted worker whose group finished cleanly and that ran only rayb's own code asks to be `kept`: its
    group's shutdown spares it (trainer.EnvController), and it goes back to the warm workers, for the
    pool's next group, or for the driver's next pool (`leftover`). It hands out the synchronization actors the
    driver keeps for its groups in the same way, one per group: Ray Train kills the one a group adopted
    unless the group ends cleanly, when it is idle again; a lost or stopped controller's is killed here.

    In a CPU study it also relays evaluation jobs to the workers of groups with no trial left to take, once
    no trial waits for a group at all (eval/actors.DrainedWorkers): such a worker holds CPUs that no queued
    trial needs, and has imported what an eval actor would import again. The relay is open only while an
    eval pool asks for its state (at least every LEASE_S): a pool run with none, or whose eval pool has
    died, lets its drained workers go. Those methods run in a concurrency group of their own ("relay"),
    since `evaluate` waits for its job's end.

    Each change an eval pool acts on (a trial finished or taken, a group started or ended, a drained worker
    free) moves the queue's `version`, which the pool waits on (`changed`) rather than asking again and
    again beside the training steps."""

    CHECK_S = 1.0  # how often a relayed job's worker is asked after
    KILL_S = 30.0  # the longest a killed worker is waited for
    LEASE_S = 30.0  # an eval pool asks at least every 5 s, or after a scan of the trials on object storage
    ASK_S = 1.0  # the longest a free drained worker's ask for a job waits before it asks again

    def __init__(
        self, queues: dict[str, list[str]], warm: list[tuple[str, bytes]] = (),
        syncs: list[tuple[str, bytes, dict]] = (),
    ):  # fmt: skip
        self.waiting = {shape: deque(keys) for shape, keys in queues.items()}
        self.held: dict[str, str] = {}  # {group (its run name): trial key}
        self.controllers: dict[str, bytes] = {}  # {controller actor id: its handle, pickled} while it runs
        self.warm = list(warm)  # Train workers started ahead, (actor id, pickled handle), until adopted
        self.adopted: dict[str, list[tuple[str, bytes]]] = {}  # {controller actor id: the warm workers taken}
        self.keeping: dict[str, set[str]] = {}  # {controller actor id: its adopted workers asking to be kept}
        self.spared: dict[str, set[str]] = {}  # {controller actor id: those its group's shutdown left alive}
        self.syncs = list(syncs)  # idle synchronization actors, (actor id, pickled handle, their arguments)
        self.adopted_syncs: dict[str, tuple[str, bytes, dict]] = {}  # {controller actor id: its group's}
        self.spared_syncs: set[str] = set()  # controllers whose group's clean end leaves its actor idle
        self.stopping = False
        self._relay = threading.Condition()  # guards the relay's state below
        self._free: list[str] = []  # drained workers (actor ids) waiting for a job, the earliest first
        self._busy: set[str] = set()  # drained workers running a job
        self._handed: dict[str, bytes] = {}  # {worker: the job it is to run, pickled} until it asks for it
        self._results: dict[str, dict] = {}  # {worker: its job's result} until `evaluate` returns it
        self._released = False
        self._asked = -math.inf  # when an eval pool last asked for the relay's state
        self._version = 0  # moved by each change an eval pool acts on (`changed`)

    def _moved(self) -> None:
        with self._relay:
            self._version += 1
            self._relay.notify_all()

    def started(self, controller: str, handle: bytes) -> None:
        """A run's controller has started (`handle`: its actor handle, pickled): ended at once if the pool
        has stopped, else when it stops."""
        self.controllers[controller] = handle
        self._moved()
        if self.stopping:
            self._end(controller)

    def stop(self) -> None:
        """End every running group's run; a group that starts later is ended as it starts."""
        self.stopping = True
        self.release()
        for controller in list(self.controllers):
            self._end(controller)

    def _end(self, controller: str) -> None:
        """Kill the controller, not abort it: one waiting for its worker group's resources blocks its event
        loop until Ray Train's start timeout, so its `abort` would wait as long. Its workers die with it;
        its placement groups are removed."""
        import ray

        ray.kill(ray.cloudpickle.loads(self.controllers.pop(controller)))
        self._kill_adopted(controller)
        _remove_placement_groups(controller)

    def adopt(self, count: int, controller: str) -> list[bytes]:
        """`count` warm workers (pickled handles) for the worker group `controller` starts, or none if fewer
        are left."""
        if len(self.warm) < count:
            return []
        taken, self.warm = self.warm[:count], self.warm[count:]
        self.adopted.setdefault(controller, []).extend(taken)
        return [handle for _, handle in taken]

    def adopt_sync(self, controller: str, arguments: dict) -> bytes | None:
        """An idle synchronization actor started with `arguments` (its pickled handle) for the worker group
        `controller` starts, or None. One a restarted group adopted before has been killed with that group."""
        self.adopted_syncs.pop(controller, None)
        for index, (_, _, started_with) in enumerate(self.syncs):
            if started_with == arguments:
                self.adopted_syncs[controller] = self.syncs.pop(index)
                return self.adopted_syncs[controller][1]
        return None

    def keep(self, controller: str, worker: str) -> None:
        """An adopted worker of `controller`'s group asks to be kept once its group ends: its train function
        ends without error, and it ran only rayb's own code (train/loop.py)."""
        if worker in {actor for actor, _ in self.adopted.get(controller, [])}:
            self.keeping.setdefault(controller, set()).add(worker)

    def kept(self, controller: str) -> list[str]:
        """The workers (actor ids) that `controller`'s group, finishing cleanly, is to leave alive: warm again
        once its run has `ended`."""
        self.spared[controller] = self.keeping.pop(controller, set())
        if controller in self.adopted_syncs:
            self.spared_syncs.add(controller)
        return sorted(self.spared[controller])

    def leftover(self) -> tuple[list[str], list[str]]:
        """The warm workers and synchronization actors (actor ids) no group holds as the pool ends, for the
        driver to keep."""
        workers, self.warm = self.warm, []
        syncs, self.syncs = self.syncs, []
        return [actor for actor, _ in workers], [actor for actor, _, _ in syncs]

    def _kill_adopted(self, controller: str) -> None:
        """Kill the warm workers that `controller`'s groups adopted, and wait until the GCS has them dead.
        Unpickling their handles imports Ray Train here, which only a lost or stopped controller costs."""
        import ray
        from ray._private.state import actors

        self.keeping.pop(controller, None)
        self.spared.pop(controller, None)
        self.spared_syncs.discard(controller)
        workers = [ray.cloudpickle.loads(handle) for _, handle in self.adopted.pop(controller, [])]
        if (sync := self.adopted_syncs.pop(controller, None)) is not None:
            ray.kill(ray.cloudpickle.loads(sync[1]))  # the driver's actor: it outlives the controller
        for worker in workers:
            ray.kill(worker)
        deadline = time.monotonic() + self.KILL_S
        for worker in workers:
            while actors(worker._actor_id.hex()).get("State") != "DEAD" and time.monotonic() < deadline:
                time.sleep(0.05)

    def ended(self, controller: str) -> None:
        """A run has ended: Ray Train's own shutdown has killed its workers, adopted ones included, but for
        those it spared (`kept`), which are warm again, as is the synchronization actor of a group that ended
        cleanly."""
        self.controllers.pop(controller, None)
        self.keeping.pop(controller, None)
        spared = self.spared.pop(controller, set())
        self.warm[:0] = [worker for worker in self.adopted.pop(controller, []) if worker[0] in spared]
        sync = self.adopted_syncs.pop(controller, None)
        if sync is not None and controller in self.spared_syncs:  # else Ray Train has killed it
            self.syncs.append(sync)
        self.spared_syncs.discard(controller)
        self._moved()

    def lost(self, controller: str) -> None:
        """A run's controller died without ending its run: its placement groups are removed, and the warm
        workers it adopted are killed."""
        _remove_placement_groups(controller)
        self._kill_adopted(controller)
        self.ended(controller)

    def take(self, shape: str, group: str, finished: str | None = None) -> str | None:
        """The group's next trial (None once its queue is empty), after the one it `finished`. The trial a
        group held before it was restarted goes to it again once earlier runs' adopted workers are dead."""
        if finished is not None and self.held.get(group) == finished:
            del self.held[group]
        elif group in self.held:
            self._kill_adopted_of_dead_controllers()
        if group not in self.held and self.waiting[shape]:
            self.held[group] = self.waiting[shape].popleft()
        self._moved()
        return self.held.get(group)

    def _kill_adopted_of_dead_controllers(self) -> None:
        from ray._private.state import actors

        for controller in list(self.adopted):
            if actors(controller).get("State") == "DEAD":
                self._kill_adopted(controller)

    def fail(self, shape: str, group: str) -> tuple[str | None, list[str]]:
        """A group that failed for good: the trial it held, and its shape's waiting trials, which go untrained
        with it (as a user's model that crashes would crash in each of its trials)."""
        waiting, self.waiting[shape] = list(self.waiting[shape]), deque()
        self._moved()
        return self.held.pop(group, None), waiting

    # ----- evaluations relayed to drained workers ---------------------------------------------------------

    @ray.method(concurrency_group="relay")
    def job_for(self, worker: str) -> bytes | str | None:
        """A drained worker's next evaluation job (pickled), once handed to it (or WAIT after ASK_S without
        one); None once it may go: when released, while a trial still waits for a group (the CPUs it holds
        may be the ones needed), or with no eval pool asking for jobs. A job handed to it before any of those
        is still its to run: `evaluate` waits for that job's result."""
        with self._relay:
            if (job := self._handed.pop(worker, None)) is not None:
                return job
            unasked = time.monotonic() - self._asked > self.LEASE_S
            if self._released or unasked or any(self.waiting.values()):
                if worker in self._free:
                    self._free.remove(worker)
                return None
            if worker not in self._free:
                self._free.append(worker)
                self._moved()
            self._relay.wait_for(lambda: worker in self._handed or self._released, timeout=self.ASK_S)
            return self._handed.pop(worker, None) or WAIT

    @ray.method(concurrency_group="relay")
    def done(self, worker: str, result: dict) -> None:
        with self._relay:
            self._results[worker] = result
            self._moved()

    @ray.method(concurrency_group="relay")
    def relay_state(self) -> dict:
        """What the eval pool decides on: drained workers `free` for a job (and `busy` with one); whether the
        workers have been `released`; whether the pool is `drained` (no trial waits for a group) and
        `finished` (none is held either: every trial has finished training); how many `groups` run (a
        drained worker may yet come); and the queue's `version` (see `changed`)."""
        with self._relay:
            self._asked = time.monotonic()
            drained = not any(self.waiting.values())
            return {
                "version": self._version,
                "free": len(self._free),
                "busy": len(self._busy),
                "released": self._released,
                "drained": drained,
                "finished": drained and not self.held,
                "groups": len(self.controllers),
            }

    @ray.method(concurrency_group="relay")
    def changed(self, seen: int, timeout_s: float) -> int:
        """The queue's version, once it has moved from `seen` (or `timeout_s` on)."""
        with self._relay:
            self._relay.wait_for(lambda: self._version != seen, timeout=timeout_s)
            return self._version

    @ray.method(concurrency_group="relay")
    def release(self) -> None:
        """Let the drained workers go once their jobs end: no more jobs will be relayed."""
        with self._relay:
            self._released, self._free = True, []
            self._relay.notify_all()

    @ray.method(concurrency_group="relay")
    def evaluate(self, job: bytes) -> dict | None:
        """Run `job` (pickled) on the drained worker that has waited longest; its result once it has ended,
        or None at once with no worker free. Raises if that worker dies first (its node lost, say): the
        eval pool then runs the job again, as it does a job whose actor was lost."""
        from ray._private.state import actors

        with self._relay:
            if self._released or not self._free:
                return None
            worker = self._free.pop(0)
            self._handed[worker] = job
            self._busy.add(worker)
            self._relay.notify_all()
            try:
                while not self._relay.wait_for(lambda: worker in self._results, timeout=self.CHECK_S):
                    try:
                        dead = actors(worker).get("State") == "DEAD"
                    except Exception:  # the GCS unreachable for a moment: ask again next time
                        continue
                    if dead:
                        self._handed.pop(worker, None)
                        raise RuntimeError(f"the drained Train worker {worker} running the job was lost")
                return self._results.pop(worker)
            finally:
                self._busy.discard(worker)


def _remove_placement_groups(controller: str) -> None:
    """Remove the placement groups the Train controller `controller` (an actor id) created that are still
    there, pending or placed. One killed while its worker group started had placed one and not yet started
    the group: found by its creator, it holds no CPU for the rest of the study."""
    from ray._private.state import state
    from ray.core.generated.gcs_pb2 import PlacementGroupTableData
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    for raw in state._connect_and_get_accessor().get_placement_group_table():  # not public API: Ray 2.60's
        group = PlacementGroupTableData.FromString(raw)
        if group.creator_actor_id.hex() == controller and group.state != PlacementGroupTableData.REMOVED:
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(group.placement_group_id)))


def queue_actor(relay: int):
    """TrialQueue as a Ray actor class, with `relay` threads for the relay's calls (two for each drained
    worker: its waiting ask and the job it runs; and a few for the eval pool's calls)."""
    return ray.remote(concurrency_groups={"relay": relay})(TrialQueue)
