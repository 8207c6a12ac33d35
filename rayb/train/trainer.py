"""Ray Train: one trainer per worker group, named after it so a relaunch resumes it; the actor all its
runs share, started early; the Train workers a pool starts ahead of its groups; and the kernel probe and
self-checks a GPU study runs on a GPU worker before it trains."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
from ray.train.v2._internal.constants import get_env_vars_to_propagate
from ray.train.v2._internal.execution.callback import ControllerCallback, ReportCallback
from ray.train.v2._internal.execution.controller import TrainController
from ray.train.v2._internal.execution.scaling_policy import FixedScalingPolicy
from ray.train.v2._internal.execution.worker_group import WorkerGroup
from ray.train.v2._internal.execution.worker_group import state as group_state
from ray.train.v2._internal.execution.worker_group import worker_group as group_module
from ray.train.v2._internal.execution.worker_group.worker import RayTrainWorker as TrainWorker
from ray.train.v2._internal.execution.worker_group.worker import Worker
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from rayb import imports_frozen, runtime, storage
from rayb.registry import is_import_path
from rayb.train.backend import TorchGroup
from rayb.train.trial import LATEST_CHECKPOINT, TrialPack, checkpoint_record, tag_trial
from rayb.tune.packs import worker_resources

if TYPE_CHECKING:  # Ray Train's controller, which unpickles this module, imports none of these
    from rayb.models.kernels import KernelPath
    from rayb.models.selfcheck import CheckResult, ModelToCheck

MAX_WORKER_FAILURES = 2  # a killed worker restarts the group from the last checkpoint

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _replaced(module, name: str, value):
    """Within, `module`'s global `name` is `value`."""
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


class _Adopted:
    """Stands for Ray Train's SynchronizationActor class while a worker group that adopted one starts: the
    actor it starts is the adopted one."""

    def __init__(self, handle):
        self.handle = handle

    def options(self, **options) -> _Adopted:
        return self

    def remote(self, **arguments):
        return self.handle


class PoolCleaner(ControllerCallback):
    """Ray Train's PlacementGroupCleanerCallback for a run of the pool, with the pool's queue as the cleaner
    (tune/group.TrialQueue): the run registers its controller there (which the queue ends if the pool
    stops, removing its placement groups, as it does a lost controller's), and lets go of it once it ends."""

    def __init__(self, queue: str):
        self.queue = queue
        self.controller: str | None = None

    def after_controller_start(self, train_run_context) -> None:
        import ray

        context = ray.get_runtime_context()
        self.controller = context.get_actor_id()
        # The controller's handle goes pickled, for the queue to unpickle only to end the run. An actor
        # handle, unpickled, imports its class's module: Ray Train's controller, and with it Ray Data,
        # pandas and pyarrow, which the queue's process needs for nothing else. This call waits on the
        # queue as each group starts: 0.3 s on 2 idle cores, more beside the other starts.
        handle = ray.cloudpickle.dumps(context.current_actor)
        ray.get(ray.get_actor(self.queue).started.remote(self.controller, handle))

    def after_controller_finish(self, result) -> None:
        self._let_go()

    def before_controller_abort(self) -> None:
        self._let_go()

    def _let_go(self) -> None:
        import ray

        if self.controller is not None:
            ray.get(ray.get_actor(self.queue).ended.remote(self.controller))
            self.controller = None


class CheckpointRecorder(ReportCallback):
    """Records each checkpoint Ray Train registers as its trial's latest, in the trial's own directory:
    in the run's controller, as soon as every rank's files are stored (the workers upload them on threads
    of their own while they train: train/loop._checkpoint). A relaunch that packs the trial into another
    run resumes from the record; Ray Train's own snapshot serves only its run."""

    def __init__(self, pack: TrialPack):
        self.run = pack.run_name
        self.trial_dirs = {trial.key: trial.trial_dir for trial in pack.trials}

    def after_report(self, training_report, metrics) -> None:
        checkpoint = training_report.checkpoint
        if checkpoint is None:
            return
        tag = training_report.metrics["tag"]
        record = checkpoint_record(self.run, checkpoint.path, tag)
        try:
            storage.write_bytes(
                storage.join(self.trial_dirs[tag_trial(tag)], LATEST_CHECKPOINT), json.dumps(record).encode()
            )
        except Exception:  # the last record stands: a relaunch elsewhere resumes from an earlier checkpoint
            logger.warning("recording checkpoint %s failed", record, exc_info=True)


class UnservedScalingPolicy(FixedScalingPolicy):
    """Ray Train's policy for a fixed worker group, less its resource requests: where no autoscaler serves
    them (rayb's private local instance), they would only keep Ray Train's autoscaling coordinator alive,
    an actor process of its own that wakes a hundred times a second beside the training steps (on 2 cores
    each idle actor process slowed a small model's steps by about 0.5%: bench/idle_actors.py)."""

    def after_controller_start(self, train_run_context) -> None:
        pass  # Ray Train's registers the run's resources with the coordinator, starting it if need be

    def _maybe_send_resource_request(self) -> None:
        pass


class InheritingWorkerGroup(WorkerGroup):
    """Ray Train's worker group, whose workers' runtime env leaves out the environment variables they
    inherit anyway (`inherited`: the environment its controller's process started with, which on rayb's
    private instance every process has, runtime.TRAIN_SETTINGS included). With none left, a worker has no
    runtime env and starts as any idle worker Ray keeps, or as a plain new process (see EnvController); a
    variable whose value differs from the inherited one (a setting changed after Ray started) still goes in
    the runtime env. With no runtime env for its workers, a CPU group adopts the Train workers its pool
    started ahead, if its queue (`warm_from`) still has as many as it needs (kept.start_warm_workers); and
    any group adopts a synchronization actor the queue keeps idle (kept.start_sync_actors)."""

    inherited: dict[str, str] = {}
    warm_from: str | None = None
    _sync_actor = None  # the kept synchronization actor this group adopted, if it did
    _spare_sync = False  # whether its shutdown leaves that actor alive (a clean finish: spare_kept)

    def _start_impl(self, worker_group_state_builder):
        """Ray Train's (2.60's), with a synchronization actor of the pool's in place of the new one Ray Train
        starts for each worker group: a process of its own, whose import of Ray Train (Ray Data, pandas,
        pyarrow) took 1.2 CPU-seconds of the group's start on 2 cores. Ray Train starts it inline, so the
        module's name for its class stands for the adopted actor while the group starts."""
        self._sync_actor, self._spare_sync = self._adopt_sync_actor(), False
        if self._sync_actor is None:
            return super()._start_impl(worker_group_state_builder)
        with _replaced(group_module, "SynchronizationActor", _Adopted(self._sync_actor)):
            return super()._start_impl(worker_group_state_builder)

    def _adopt_sync_actor(self):
        """An idle synchronization actor from the pool's queue, started with this group's arguments, or None."""
        import ray

        if self.warm_from is None:
            return None
        controller = ray.get_runtime_context().get_actor_id()
        arguments = {
            "timeout_s": self._collective_timeout_s,
            "warn_interval_s": self._collective_warn_interval_s,
        }
        handle = ray.get(ray.get_actor(self.warm_from).adopt_sync.remote(controller, arguments))
        return None if handle is None else ray.cloudpickle.loads(handle)

    def shutdown(self):
        """Ray Train's, leaving alive the synchronization actor the group adopted where it finished cleanly
        (spare_kept): Ray Train kills its group's actor as its group ends."""
        import ray

        spared = self._sync_actor if self._spare_sync else None
        if spared is None:
            return super().shutdown()
        with _replaced(group_state, "_shutdown_sync_actor", lambda actor: actor is spared or ray.kill(actor)):
            return super().shutdown()

    def _get_worker_runtime_env(self, custom_runtime_env):
        runtime_env = dict(WorkerGroup._get_worker_runtime_env(custom_runtime_env))
        env_vars = {k: v for k, v in runtime_env.pop("env_vars").items() if self.inherited.get(k) != v}
        return runtime_env | ({"env_vars": env_vars} if env_vars else {})

    def _create_workers(self, num_workers, placement_group, resources_per_worker,
                        placement_group_bundle_indices=None, starting_world_rank=0, world_size=None,
                        replica_group_size=None):  # fmt: skip
        """Ray Train's (2.60's), with the pool's warm workers in place of new actors where it has them: the
        group's placement group still holds their resources (the workers hold none of their own)."""
        import ray
        from ray.exceptions import RayActorError
        from ray.train.v2._internal.exceptions import WorkerGroupStartupFailedError

        indices = (
            list(range(num_workers))
            if placement_group_bundle_indices is None
            else placement_group_bundle_indices
        )
        if not (actors := self._adopt(len(indices), resources_per_worker)):
            return super()._create_workers(num_workers, placement_group, resources_per_worker,
                                           placement_group_bundle_indices, starting_world_rank, world_size,
                                           replica_group_size)  # fmt: skip
        try:
            metadata = ray.get([actor.get_metadata.remote() for actor in actors])
        except RayActorError as exc:
            for actor in actors:
                ray.kill(actor)
            raise WorkerGroupStartupFailedError("a Train worker started ahead of its group failed") from exc
        workers = [Worker(actor, meta, resources_per_worker, placement_group_bundle_index=index)
                   for index, actor, meta in zip(indices, actors, metadata, strict=True)]  # fmt: skip
        return WorkerGroup._assign_worker_ranks(workers, starting_world_rank, world_size, replica_group_size)

    def _adopt(self, count: int, resources: dict[str, float]) -> list:
        """`count` warm workers from the pool's queue, or none: where there is no queue to ask, where the
        workers need GPUs (a warm worker holds none, so Ray shows it none), a runtime env (a warm worker
        has none) or a worker class of their own, or where the queue has fewer left."""
        import ray

        custom_env = self._train_run_context.run_config.worker_runtime_env
        if (self.warm_from is None or resources.get("GPU") or self._worker_cls is not TrainWorker
                or self._get_worker_runtime_env(custom_env)):  # fmt: skip
            return []
        controller = ray.get_runtime_context().get_actor_id()
        taken = ray.get(ray.get_actor(self.warm_from).adopt.remote(count, controller))
        return [ray.cloudpickle.loads(handle) for handle in taken]

    def spare_kept(self) -> None:
        """Before a clean shutdown: leave out of it the workers the pool's queue keeps (TrialQueue.kept), so
        that Ray Train neither kills them nor has them leave their process group: a kept worker has a group
        of one, which its next group reuses (backend._join_process_group). Their Ray Train shutdown hooks
        still run. An adopted synchronization actor is left alive too, its barrier at rest."""
        import dataclasses

        import ray

        state = self._worker_group_state
        if self.warm_from is None or state is None:
            return
        self._spare_sync = self._sync_actor is not None  # the queue keeps it idle once the run has ended
        controller = ray.get_runtime_context().get_actor_id()
        kept = set(ray.get(ray.get_actor(self.warm_from).kept.remote(controller)))
        spared = [w for w in state.workers if w.actor._actor_id.hex() in kept]
        if spared:
            ray.wait([w.actor.shutdown.remote() for w in spared], num_returns=len(spared), timeout=5)
            rest = [w for w in state.workers if w not in spared]
            self._worker_group_state = dataclasses.replace(state, workers=rest)


class RayTrainWorker(TrainWorker):
    """Ray Train's worker (named as Ray Train's, which Ray titles its process and lists its actor by) as the
    pool starts it ahead of the worker group that adopts it (kept.start_warm_workers): its process imports what
    a CPU worker imports once its group has started (torch, for Ray Train's torch functions, rayb's loop,
    DeepSpeed and transformers' modeling_utils) while the group's controller starts, which otherwise comes
    first, and leaves all of it out of its garbage collections (rayb.imports_frozen)."""

    def __init__(self):
        super().__init__()
        with imports_frozen():
            import ray.train.torch.config  # noqa: F401  (train/backend.py's functions import it on the worker)

            from rayb.train.loop import import_worker_libraries

            import_worker_libraries(use_gpu=False)

    def init_train_context(self, *args, **kwargs):
        """Ray Train's, with the run's own checkpoint uploads and their ordering. Ray's TrainContext defaults
        them to one thread pool and one condition per process, and shuts that pool down as a run's train
        function ends: a worker kept for another group (tune/group.TrialQueue.keep) could not report again."""
        import threading
        from concurrent.futures import ThreadPoolExecutor

        from ray.train.v2._internal.execution.context import MAX_CHECKPOINT_UPLOAD_THREADS, get_train_context

        super().init_train_context(*args, **kwargs)
        context = get_train_context()
        context.checkpoint_upload_threadpool = ThreadPoolExecutor(max_workers=MAX_CHECKPOINT_UPLOAD_THREADS)
        context.report_order_condition = threading.Condition()


class EnvController(TrainController):
    """Ray Train's controller, handed the environment variables Ray Train propagates as an argument rather
    than in a runtime_env. Ray never runs an actor that has a runtime_env of its own on the idle workers it
    starts ahead (they have none), nor any actor that actor starts, which inherits it (the run's
    SynchronizationActor): each gets a new process, 2.2-2.7 s on 2 cores against 0.2 s for an idle worker
    (and 1.2-1.4 s for a new process with no runtime env). An empty loop's PackTrainer.fit took 13.9-14.0 s
    with Ray Train's controller and 9.7-10.7 s with this one (three runs each, interleaved, 2 cores). Ray
    Train reads each such variable in the controller when it uses it, so setting them first thing in the
    controller's process is the same. Its workers get them in a runtime_env, from the controller's
    environment; where `workers_inherit` (rayb's private instance: one node, whose every process has the
    environment this controller's process started with), only those that environment lacks
    (InheritingWorkerGroup, which adopts the workers the pool's queue `warm_from` holds). The one read at
    import, RAY_TRAIN_V2_ENABLED, only picks the API `ray.train` exports: rayb needs V2, Ray's default.

    A controller whose run of the pool finished cleanly is kept by the driver and made the controller of
    its next run (`reset`, kept.take_controller), rather than a new process importing Ray Train again
    (1.6 CPU-seconds, on the group's critical path); so is one the driver starts with no run, ahead of a
    study's first (kept.start_controller_ahead)."""

    def __init__(self, env_vars: dict[str, str] | None = None, workers_inherit: bool = False,
                 warm_from: str | None = None, **kwargs):  # fmt: skip
        # The environment this process started with, every worker's too (a reset keeps the first one's).
        self._started_with = getattr(self, "_started_with", None) or dict(os.environ)
        if env_vars is None:  # started ahead of a run (kept.start_controller_ahead), whose `reset` starts it
            return
        if workers_inherit:
            self.worker_group_cls = type(
                "InheritingWorkerGroup",
                (InheritingWorkerGroup,),
                {"inherited": dict(self._started_with), "warm_from": warm_from},
            )
        os.environ.update(env_vars)
        super().__init__(**kwargs)
        self._hurried_for: set[str] = set()  # what a worker waits for the next poll to see: "report", "end"
        self._woken = asyncio.Event()

    def reset(
        self, env_vars: dict[str, str], workers_inherit: bool, warm_from: str | None = None, **kwargs
    ) -> None:
        """Make this controller, whose last run finished cleanly, the controller of a new run, as a new one
        would start it (Ray Train's controller keeps all of a run's state in what its constructor sets), from
        the environment its process started with: a setting the earlier run was handed is not this run's."""
        os.environ.clear()
        os.environ.update(self._started_with)
        self.__init__(env_vars, workers_inherit, warm_from, **kwargs)

    def _shutdown_worker_group(self):
        """Ray Train's, where the run has finished cleanly sparing the workers the pool keeps
        (InheritingWorkerGroup.spare_kept)."""
        from ray.train.v2._internal.execution.controller.state import FinishedState, ShuttingDownState

        state = self.get_state()
        finished = isinstance(state, ShuttingDownState) and isinstance(state.next_state, FinishedState)
        if finished and isinstance(self._worker_group, InheritingWorkerGroup):
            self._worker_group.spare_kept()
        super()._shutdown_worker_group()

    # Ray Train polls its workers every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (2 s by default), and only a poll
    # takes a worker's checkpoint report or sees its train function end. Where a worker waits for one
    # (the registration of its last checkpoint, or its run's end), the controller is hurried: it polls at
    # once and then every HURRIED_POLL_S until a poll brings what it waits for (a report, or the group's
    # end), or an error. Polling every 0.5 s instead cost training: each poll wakes the controller and
    # every worker's process beside the training threads (on 2 cores a small model's steps took 1-3%
    # longer).
    HURRIED_POLL_S = 0.05

    def hurry(self, until: str = "end") -> None:
        """A worker waits for the next poll to see its train function's `end` (train/loop.py), or take its
        `report`."""
        self._hurried_for.add(until)
        self._woken.set()

    async def get_all_reported_checkpoints(self, current_report_index: int, *args, **kwargs):
        """Ray Train's, which waits until this controller has taken the worker's reports so far: hurried
        where one has not been taken yet."""
        if self._checkpoint_manager._current_report_index != current_report_index:
            self.hurry("report")
        return await super().get_all_reported_checkpoints(current_report_index, *args, **kwargs)

    async def _poll_workers(self):
        """Ray Train's poll, an interval after the last one, or sooner where hurried."""
        interval = self.HURRIED_POLL_S if self._hurried_for else self._health_check_interval_s
        if (wait_s := self._latest_poll_time + interval - time.monotonic()) > 0:
            self._woken.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._woken.wait(), wait_s)
        if self._hurried_for:
            self._latest_poll_time = -math.inf  # Ray Train's own wait for its interval: none
        status = await super()._poll_workers()
        workers = status.worker_statuses.values()
        # The poll that takes a group's last report may come just before its train function's end, which
        # stays hurried until a poll sees it.
        if any(s.training_report for s in workers):
            self._hurried_for.discard("report")
        if status.finished or any(s.error for s in workers):
            self._hurried_for.clear()
        return status


class PackTrainer(DataParallelTrainer):
    """A TorchTrainer's run (torch's process group, from train/backend.py), with less to start: each run of
    Ray Train also starts a DatasetManager actor, a process of its own, and sends every worker Ray Data's
    context, datasets or none. rayb passes none (each worker reads its trials' token cache itself). Nor does
    a run start Ray Train's placement-group cleaner, a detached actor per run that asks the dashboard's
    State API about its controller every second (rayb starts no local dashboard; without one the cleaner
    only logs that it cannot ask). A run of the pool (`queue`: its TrialQueue actor's name) has the queue
    clean up after it (PoolCleaner); a run outside the pool (a test's single pack) has no cleaner. A run of
    a `pack` records each checkpoint it registers in its trial's directory (CheckpointRecorder). Without
    `requests_resources` a run asks no autoscaler for its workers (UnservedScalingPolicy)."""

    def __init__(self, *args, pack: TrialPack | None = None, queue: str | None = None,
                 requests_resources: bool = True, **kwargs):  # fmt: skip
        self.pack, self.queue, self.requests_resources = pack, queue, requests_resources
        super().__init__(*args, **kwargs)

    def _initialize_and_run_controller(self, **controller_init_kwargs):
        """Ray Train's own, with its controller an EnvController, handed rayb's settings for Ray Train
        (runtime.TRAIN_SETTINGS) where this process's environment has no setting of its own. A run of the
        pool takes a controller this driver kept, where it has one; its controller is kept in turn where
        the run finishes cleanly."""
        import ray

        from rayb.train import kept

        policy = controller_init_kwargs["scaling_policy"]
        if not self.requests_resources and type(policy) is FixedScalingPolicy:  # rayb's groups are fixed
            controller_init_kwargs["scaling_policy"] = UnservedScalingPolicy(self.scaling_config)
        env_vars = dict(runtime.TRAIN_SETTINGS) | get_env_vars_to_propagate()  # a user's own setting wins
        arguments = {"env_vars": env_vars, "workers_inherit": not self.requests_resources,
                     "warm_from": self.queue, **controller_init_kwargs}  # fmt: skip
        controller = self._kept_controller(arguments) if self.queue is not None else None
        if controller is None:
            controller = new_controller(**arguments)
        # Ray Train's Ctrl-C handler aborts this run; it goes once the run ends, for it holds the controller's
        # handle (which kept an idle controller alive until the next run's handler replaced it) and would
        # abort a run long over. Only on the main thread: elsewhere signal handlers cannot be set.
        on_main_thread = threading.current_thread() is threading.main_thread()
        if on_main_thread:
            previous = signal.getsignal(signal.SIGINT)  # None where it was not set from Python
            self._register_sigint_handler(controller)
        try:
            ray.get(controller.run.remote())
        except ray.exceptions.RayActorError:
            self._lost(controller._actor_id.hex())
            raise
        finally:
            if on_main_thread:
                signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
        result = ray.get(controller.get_result.remote())
        if self.queue is not None and result.error is None:
            kept.keep_controller(controller)
        return result

    @staticmethod
    def _kept_controller(arguments: dict[str, Any]):
        """A controller this driver kept, made this run's (EnvController.reset), or None. One that cannot be
        (ended since, or its constructor failed) is ended, and the run starts a new one."""
        import ray

        from rayb.train import kept

        while (controller := kept.take_controller()) is not None:
            try:
                ray.get(controller.reset.remote(**arguments))
                return controller
            except ray.exceptions.RayError:
                ray.kill(controller)
        return None

    def _lost(self, controller: str) -> None:
        """Tell the pool's queue that the run's controller died (killed, out of memory): what its run held
        goes now (tune/group.TrialQueue.lost). A queue that has gone itself (the pool ended) needs telling
        nothing."""
        import ray

        if self.queue is not None:
            with contextlib.suppress(ValueError, ray.exceptions.RayActorError):
                ray.get(ray.get_actor(self.queue).lost.remote(controller))

    def _create_default_callbacks(self):
        dropped = (DatasetsCallback, PlacementGroupCleanerCallback)
        callbacks = [c for c in super()._create_default_callbacks() if not isinstance(c, dropped)]
        recorder = [CheckpointRecorder(self.pack)] if self.pack else []
        return callbacks + recorder + ([PoolCleaner(self.queue)] if self.queue else [])


def new_controller(**arguments):
    """An EnvController on the driver's node (which outlives the others); with no `arguments`, idle till `reset`."""
    import ray

    on_this_node = {ray._raylet.RAY_NODE_ID_KEY: ray.get_runtime_context().get_node_id()}
    return ray.remote(num_cpus=0, label_selector=on_this_node)(EnvController).remote(**arguments)


def pack_trainer(
    pack: TrialPack,
    loop: Callable[[dict[str, Any]], None] | None = None,
    one_node: bool = True,
    queue: str | None = None,
    requests_resources: bool = True,
) -> PackTrainer:
    """The Ray Train trainer whose `.fit()` trains a pack's trials on one worker group, or with a `queue`
    (the pool's TrialQueue actor, by name) the trials the group takes from it: on a single node where
    `one_node` (packs.one_node), else across nodes; asking the cluster's autoscaler for its workers where
    `requests_resources` (an autoscaler may serve the cluster: not on runtime.private_instance()). `loop`
    is the per-worker function (rayb's by default; a test may wrap it)."""
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

    t = pack.train
    return PackTrainer(
        loop or train_on_worker,
        pack=pack,
        queue=queue,
        requests_resources=requests_resources,
        # When, and on which node, the driver asked for the group: the loop reports how long the group
        # took to start (a worker on another node reports nothing: its clock is another machine's).
        train_loop_config={
            "pack": pack.to_dict(),
            "queue": queue,
            "reusable": loop is None and queue is not None and reusable_workers(pack),
            "launched_at": time.time(),
            "launched_on": ray.get_runtime_context().get_node_id(),
        },
        backend_config=TorchGroup(backend="nccl" if t.use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=t.num_workers,
            use_gpu=t.use_gpu,
            resources_per_worker=worker_resources(t),
            # NCCL within a node runs over NVLink; across nodes, over the network.
            placement_strategy="STRICT_PACK" if one_node else "PACK",
        ),  # fmt: skip
        run_config=RunConfig(
            name=pack.run_name,
            **run_storage(pack.storage_path),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            failure_config=FailureConfig(max_failures=MAX_WORKER_FAILURES),
        ),
    )


def reusable_workers(pack: TrialPack) -> bool:
    """Whether a worker of the pack's group may be kept for another group once it ends (TrialQueue.keep):
    a CPU group of one (its process group of one stays valid), training rayb's own architectures only (a
    user's model may patch what its process has imported)."""
    t = pack.train
    return t.num_workers == 1 and not t.use_gpu and not any(is_import_path(x.arch) for x in pack.trials)


def run_storage(location: str) -> dict[str, Any]:
    """RunConfig's storage for runs under `location`: on object storage, the filesystem rayb writes the
    rest of the study through (storage.filesystem), so that Ray Train uploads each checkpoint's files as
    rayb writes its own (one request for a small file on S3, not three); a local path as it is."""
    if not storage.is_remote(location):
        return {"storage_path": location}
    filesystem, path = storage.filesystem(location)
    return {"storage_path": path, "storage_filesystem": filesystem}


def start_train_services() -> None:
    """Start, without waiting for it, the actor that Ray Train's runs share on a cluster an autoscaler may
    serve: its autoscaling coordinator (a detached actor, on this node), to which every run's controller
    sends its resource request as it starts. Started now, its process comes up while the driver prepares
    the study; else the first worker group's controller starts it and waits for it (1-2 s on 2 cores). The
    call is Ray Train's own, so the actor is the one its runs look up by name."""
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        get_or_create_autoscaling_coordinator,
    )

    get_or_create_autoscaling_coordinator()


def train_on_worker(config: dict[str, Any]) -> None:
    """rayb's training loop, imported on the worker that runs it: Ray Train's controller, which imports
    this module, imports no torch."""
    from rayb.train.loop import train_loop_per_worker

    train_loop_per_worker(config)


def probe_kernels(archs: list[str]) -> dict[str, list[KernelPath]]:
    """Each architecture's kernel paths as a GPU worker would run them: probed in a Ray task on a GPU,
    since the packages that decide (mamba-ssm, causal-conv1d, fla) are the workers', not the driver's."""
    import ray

    @ray.remote(num_gpus=1, num_cpus=0)
    def probe(names: list[str]) -> dict[str, list[KernelPath]]:
        from rayb.models.registry import get_arch

        return {name: get_arch(name).kernels("cuda") for name in names}

    return ray.get(probe.remote(archs))


def gpu_self_checks(models: list[ModelToCheck], vocab_size: int, seq_len: int, train_dtype, eval_dtype,
                    decoding: bool) -> list[CheckResult]:  # fmt: skip
    """models/selfcheck.py's checks on a GPU worker, with the kernels the workers have installed."""
    import ray

    @ray.remote(num_gpus=1, num_cpus=0)
    def check() -> list[CheckResult]:
        from rayb.models.selfcheck import check_models

        return check_models(models, vocab_size, seq_len, "cuda", train_dtype, eval_dtype, decoding)

    return ray.get(check.remote())
