"""Ray clusters of several nodes on this machine, as a user starts them: `ray start --head`, then
`ray start --address=...` per extra node, each node with its own temp directory, working directory and
environment, every port a free one (the suite's own Ray runs beside them)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from conftest import free_ports

NODE_PORTS = ("node-manager-port", "object-manager-port", "metrics-export-port", "dashboard-agent-listen-port",
              "dashboard-agent-grpc-port", "runtime-env-agent-port")  # fmt: skip
START_LOG = "ray-start.log"
RAYLET_NOT_REGISTERED = "The current node timed out during startup"  # what `ray start` prints then
HEAD_PORTS = ("port", "dashboard-port", "ray-client-server-port", *NODE_PORTS)


@dataclass
class Node:
    process: subprocess.Popen
    temp_dir: Path  # Ray's files for this node (short: Ray's socket paths have a length limit)
    workdir: Path  # the directory the node was started in
    id: str = ""  # Ray's node id

    def log(self) -> str:
        """The end of what `ray start` printed (kept in the node's temp directory)."""
        return (self.temp_dir / START_LOG).read_text()[-3000:]

    def kill(self) -> None:
        """Lose this node as a crashed machine is lost: its raylet killed at once, then every other
        process of it (those that name its temp directory, and their children), with no chance to drain."""
        import psutil

        named = [
            p
            for p in psutil.process_iter(["cmdline"])
            if str(self.temp_dir) in " ".join(p.info["cmdline"] or [])
        ]
        family = {p.pid: p for p in named}
        for proc in named + ([psutil.Process(self.process.pid)] if self.process.poll() is None else []):
            with contextlib.suppress(psutil.NoSuchProcess):
                family |= {child.pid: child for child in proc.children(recursive=True)}
        raylet_first = sorted(family.values(), key=lambda p: "raylet/raylet" not in " ".join(_cmdline(p)))
        for proc in raylet_first:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        self.process.kill()
        self.process.wait()


def _ports(flags: tuple[str, ...]) -> dict[str, int]:
    """A distinct free port for each of a node's port flags."""
    return dict(zip(flags, free_ports(len(flags)), strict=True))


def _fake_autoscaler(head_cpus: int, node_types: dict[str, dict], gcs_port: int) -> dict:
    """A `ray up` configuration for Ray's fake multi-node provider (its nodes are processes here)."""
    head = "ray.head.default"  # the provider's own name for the head's type
    return {
        "cluster_name": "rayb-fake",
        "max_workers": len(node_types),
        "idle_timeout_minutes": 60,
        "provider": {
            "type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
            "disable_launch_config_check": True, "gcs_address": f"127.0.0.1:{gcs_port}",
        },
        "available_node_types": {head: {"resources": {"CPU": head_cpus}, "node_config": {}, "max_workers": 0}}
        | {
            name: {"resources": resources, "node_config": {}, "min_workers": 0, "max_workers": 1}
            for name, resources in node_types.items()
        },
        "head_node_type": head,
        "auth": {"ssh_user": "ubuntu"},
        "file_mounts": {}, "cluster_synced_files": [],
        **dict.fromkeys(
            ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands",
             "head_start_ray_commands", "worker_start_ray_commands"), [],
        ),
    }  # fmt: skip


def _cmdline(proc) -> list[str]:
    import psutil

    try:
        return proc.cmdline()
    except psutil.Error:
        return []


@dataclass
class LocalCluster:
    env: dict[str, str]  # every node's environment (credentials, endpoints)
    root: Path
    nodes: list[Node] = field(default_factory=list)
    address: str = ""  # the dashboard's, for `ray job submit`
    gcs: str = ""  # the head's, for `ray start --address`

    def start_head(self, num_cpus: int, node_types: dict[str, dict] | None = None) -> Node:
        """The head. With `node_types` ({name: {CPU: n, ...}}), its autoscaler is Ray's own, over Ray's fake
        provider: it starts nodes of those types, from zero up to one each, as processes on this machine,
        when work waits for their resources."""
        if node_types is not None:
            self.env = self.env | {"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}

        def head_args(ports: dict[str, int]) -> list[str]:
            self.address, self.gcs = (
                f"http://127.0.0.1:{ports['dashboard-port']}",
                f"127.0.0.1:{ports['port']}",
            )
            args = ["--head", "--dashboard-host=127.0.0.1", "--include-dashboard=true"]
            if node_types is not None:
                config = self.root / "autoscaler.yaml"
                config.write_text(yaml.safe_dump(_fake_autoscaler(num_cpus, node_types, ports["port"])))
                args.append(f"--autoscaling-config={config}")
            return args

        node = self._start_until(head_args, num_cpus, HEAD_PORTS, self._runs_jobs, "head")
        (node.id,) = self.alive_nodes()
        return node

    def add_node(self, num_cpus: int) -> Node:
        """A node joining the running cluster, as an autoscaler would add one; returns once Ray counts it."""
        before = set(self.alive_nodes())
        node = self._start_until(
            lambda _: [f"--address={self.gcs}"], num_cpus, NODE_PORTS,
            lambda _: bool(set(self.alive_nodes()) - before), "node",
        )  # fmt: skip
        (node.id,) = set(self.alive_nodes()) - before
        return node

    def _runs_jobs(self, head: Node) -> bool:
        # Ready means a job runs: the job API answers before the head's job agent is up.
        probe = ["ray", "job", "submit", "--address", self.address, "--", "python", "-c", "pass"]
        return subprocess.run(probe, capture_output=True, env=self._env(head)).returncode == 0

    def alive_nodes(self) -> list[str]:
        from ray.util.state import list_nodes

        return [n.node_id for n in list_nodes(address=self.address) if n.state == "ALIVE"]

    def actors_on(self, node: Node, class_name: str) -> list:
        """The actors of a class that ran on a node, alive or gone."""
        from ray.util.state import list_actors

        actors = list_actors(address=self.address, filters=[("class_name", "=", class_name)], limit=10_000)
        return [a for a in actors if a.node_id == node.id]

    def stop(self) -> None:
        """Kill every node (a graceful `ray stop` drains for half a minute per node) and drop its files."""
        for node in reversed(list(self.nodes)):
            self._drop(node)

    def _start_until(
        self, args: Callable[[dict[str, int]], list[str]], num_cpus: int, port_flags: tuple[str, ...],
        ready: Callable[[Node], bool], what: str, retry: bool = True,
    ) -> Node:  # fmt: skip
        """Start a node and wait until it is `ready`. A `ray start` that gives up on its own raylet (Ray waits
        a fixed 30 s for it to register with the GCS, which a loaded 2-core machine can exceed) is started
        once more, on fresh ports, as an autoscaler relaunches a node that failed to come up."""
        ports = _ports(port_flags)
        node = self._start(args(ports), num_cpus, ports)
        deadline = time.time() + 180
        while not ready(node):
            if retry and node.process.poll() is not None and RAYLET_NOT_REGISTERED in node.log():
                self._drop(node)
                return self._start_until(args, num_cpus, port_flags, ready, what, retry=False)
            assert node.process.poll() is None and time.time() < deadline, (
                f"{what} did not come up: {node.log()}"
            )
            time.sleep(2)
        return node

    def _start(self, args: list[str], num_cpus: int, ports: dict[str, int]) -> Node:
        index = len(self.nodes)
        temp_dir = Path(tempfile.mkdtemp(prefix=f"rb{index}", dir="/tmp"))
        workdir = self.root / f"node{index}"
        workdir.mkdir(parents=True, exist_ok=True)  # a node started again reuses its index
        node = Node(None, temp_dir, workdir)  # type: ignore[arg-type]
        # No log monitor: it streams workers' output to drivers that ask for it, and none here does (a
        # `rayb run` sends it to files unless run with -v). It polls the node's log files all along: about
        # 16 CPU-seconds per cluster in the suite, which CI's two cores take from the tests beside it.
        with (temp_dir / START_LOG).open("w") as log:
            node.process = subprocess.Popen(
                ["ray", "start", "--block", *args, f"--num-cpus={num_cpus}", f"--temp-dir={temp_dir}",
                 "--include-log-monitor=false", *(f"--{flag}={port}" for flag, port in ports.items())],
                cwd=workdir, env=self._env(node), stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.nodes.append(node)
        return node

    def _drop(self, node: Node) -> None:
        node.kill()
        shutil.rmtree(node.temp_dir, ignore_errors=True)
        self.nodes.remove(node)

    def _env(self, node: Node) -> dict[str, str]:
        # Each node keeps its own mirror of object storage inside its own temp directory.
        return os.environ | self.env | {"RAYB_MIRROR": str(node.temp_dir / "rayb-mirror")}
