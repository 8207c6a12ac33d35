"""The cluster files under cluster/: valid for Ray's cluster launcher and for KubeRay, and safe as written.

Fast and offline: nothing here starts Ray or calls a cloud. The launcher configs go through Ray's own
schema and through the same local preparation `ray up` does before it touches a cloud; the Kubernetes
manifests are checked field by field against what KubeRay and rayb need. Study outputs go to object
storage by default (s3:// or gs://, reached with each node's own identity, never with keys written down);
the shared file system at /mnt/rayb stays available as the documented alternative, off by default.
"""

from __future__ import annotations

import ast
import copy
import ipaddress
import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import ray
import yaml

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "cluster"
LAUNCHER_CONFIGS = ["aws.yaml", "gcp.yaml"]
KUBERAY = CLUSTER / "kuberay"
RAY_PORTS = (8265, 6379, 10001)  # dashboard + job API, GCS, Ray client server
SHARED = "/mnt/rayb"  # where every node sees the shared file system, in the alternative to object storage
OBJECT_STORES = {"aws": "s3", "gcp": "gs"}  # the default output's scheme on each launcher provider
STORAGE_SECRET = "rayb-storage"  # the Kubernetes Secret the pods read object-storage credentials from
GPUS_PER_NODE = 8
A100X8_INSTANCE_TYPES = {"p4d.24xlarge", "p4de.24xlarge"}


def ray_pin() -> str:
    """The Ray version rayb pins in pyproject.toml; the cluster must run the same."""
    match = re.search(r'"ray\[[^\]]*\]==([0-9][0-9.]*)"', (REPO / "pyproject.toml").read_text())
    assert match, "pyproject.toml no longer pins ray as ray[...]==X.Y.Z"
    return match.group(1)


# ---------------------------------------------------------------------------------------------------------
# Ray cluster launcher (cluster/aws.yaml, cluster/gcp.yaml)


def load_launcher(name: str) -> dict[str, Any]:
    return yaml.safe_load((CLUSTER / name).read_text())


def prepared(name: str) -> dict[str, Any]:
    """The config as `ray up` sees it after merging the provider defaults (no cloud calls)."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(copy.deepcopy(load_launcher(name)))
    validate_config(config)
    return config


def node_gpus(node_type: dict[str, Any]) -> int:
    return node_type["resources"].get("GPU", 0)


def worker_types(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in config["available_node_types"].items() if k != config["head_node_type"]}


def setup_commands(config: dict[str, Any], node_type: str) -> list[str]:
    """What a node of this type runs at setup, with a node type's own list replacing the global one."""
    if node_type == config["head_node_type"]:
        return config["head_setup_commands"]
    return config["available_node_types"][node_type].get(
        "worker_setup_commands", config["worker_setup_commands"]
    )


def init_commands(config: dict[str, Any], node_type: str) -> list[str]:
    return config["available_node_types"][node_type].get(
        "initialization_commands", config["initialization_commands"]
    )


def docker_settings(config: dict[str, Any], node_type: str) -> tuple[str, list[str]]:
    """(image, docker run options) of a node type, as Ray's autoscaler merges them."""
    docker = config["docker"]
    if node_type == config["head_node_type"]:
        return docker.get("head_image", docker.get("image")), docker.get("run_options", []) + docker.get(
            "head_run_options", []
        )
    own = config["available_node_types"][node_type].get("docker", {})
    image = own.get("worker_image", docker.get("worker_image", docker.get("image")))
    options = docker.get("run_options", []) + own.get(
        "worker_run_options", docker.get("worker_run_options", [])
    )
    return image, options


def has_gpu_hardware(provider: str, node_config: dict[str, Any]) -> bool:
    if provider == "aws":  # P (p4d, p5), G (g5, g6) and the other accelerator families
        return bool(re.match(r"(p|g|dl|trn|inf)\d", node_config["InstanceType"]))
    return bool(node_config.get("guestAccelerators")) or node_config["machineType"].startswith(
        ("a2-", "a3-", "g2-")
    )


def installs_rayb(commands: list[str]) -> bool:
    return any(re.search(r"pip install .*-e \S*rayb\b", command) for command in commands)


@pytest.mark.parametrize("name", LAUNCHER_CONFIGS)
def test_launcher_config_follows_rays_schema(name):
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(load_launcher(name)), key=str)
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)
    prepared(name)  # Ray's own checks beyond the schema: head type exists, min/max workers agree, docker


@pytest.mark.parametrize("name", LAUNCHER_CONFIGS)
def test_head_node_has_no_gpus(name):
    config = prepared(name)
    head = config["available_node_types"][config["head_node_type"]]
    assert node_gpus(head) == 0
    assert not has_gpu_hardware(config["provider"]["type"], head["node_config"])


@pytest.mark.parametrize("name", LAUNCHER_CONFIGS)
def test_one_autoscaled_8xa100_worker_type_starting_at_zero(name):
    config = prepared(name)
    workers = worker_types(config)
    gpu_types = {k: v for k, v in workers.items() if node_gpus(v)}
    assert len(gpu_types) == 1, f"expected one GPU worker type, got {sorted(gpu_types)}"
    (gpu,) = gpu_types.values()
    assert gpu["resources"]["GPU"] == GPUS_PER_NODE
    assert 1 <= gpu["max_workers"] <= config["max_workers"]
    node = gpu["node_config"]
    if config["provider"]["type"] == "aws":
        assert node["InstanceType"] in A100X8_INSTANCE_TYPES
    else:
        accelerators = node["guestAccelerators"]
        assert sum(a["acceleratorCount"] for a in accelerators) == gpu["resources"]["GPU"]
        assert all("a100" in a["acceleratorType"] for a in accelerators)
        assert node["machineType"] == "a2-highgpu-8g"
        assert node["scheduling"]["onHostMaintenance"] == "TERMINATE"  # GCE refuses GPU VMs otherwise
    # Every worker type (not only the GPU one) scales from zero: an idle cluster is just its head.
    assert {k: v["min_workers"] for k, v in workers.items()} == dict.fromkeys(workers, 0)
    assert 0 < config["idle_timeout_minutes"] <= 60


@pytest.mark.parametrize("name", LAUNCHER_CONFIGS)
def test_setup_installs_the_checkout_with_cuda_kernels_only_on_gpu_nodes(name):
    config = prepared(name)
    assert config["file_mounts"].get("~/rayb") == ".", "the local checkout must be shipped to ~/rayb"
    for node_type, spec in config["available_node_types"].items():
        commands = setup_commands(config, node_type)
        assert installs_rayb(commands), f"{node_type} never installs ~/rayb: {commands}"
        cuda = any("rayb[cuda]" in command for command in commands)
        # The README's rule: the [cuda] extra on a CPU machine crashes transformers.
        assert cuda == bool(node_gpus(spec)), (
            f"{node_type}: rayb[cuda] installed={cuda}, GPUs={node_gpus(spec)}"
        )


def assert_pinned_ray_image(image: str, gpu: bool, where: str) -> None:
    """Ray's own image at the version rayb pins; the GPU build exactly where there are GPUs."""
    repo, _, tag = image.partition(":")
    assert repo == "rayproject/ray" and tag.startswith(ray_pin() + "-"), f"{where}: {image}"
    assert ("-gpu" in tag or "-cu" in tag) == gpu, f"{where}: {image}"


@pytest.mark.parametrize("name", LAUNCHER_CONFIGS)
def test_images_run_the_ray_that_rayb_pins(name):
    config = prepared(name)
    for node_type, spec in config["available_node_types"].items():
        image, _ = docker_settings(config, node_type)
        assert_pinned_ray_image(image, gpu=bool(node_gpus(spec)), where=node_type)


def usage_outputs(text: str) -> list[str]:
    """The --output of every `rayb run` that a file's comments show."""
    return re.findall(r"rayb run \S+ --output (\S+)", text)


@pytest.mark.parametrize("name", LAUNCHER_CONFIGS)
def test_the_shown_study_writes_to_object_storage(name):
    provider = load_launcher(name)["provider"]["type"]
    outputs = usage_outputs((CLUSTER / name).read_text())
    assert outputs, f"{name} shows no `rayb run ... --output`"
    assert all(o.startswith(f"{OBJECT_STORES[provider]}://") for o in outputs), outputs


def ray_gcp_head_roles() -> list[str]:
    """The project roles `ray up` grants the GCP head's default service account, read from Ray's source
    (importing it needs Google's client libraries, which `ray up` on GCP needs anyway but tests do not)."""
    source = Path(ray.__file__).parent / "autoscaler" / "_private" / "gcp" / "config.py"
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
            "DEFAULT_SERVICE_ACCOUNT_ROLES"
        ]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{source} no longer defines DEFAULT_SERVICE_ACCOUNT_ROLES")


AWS_PROFILE_ARN = re.compile(r"arn:aws:iam::(\d{12}|ACCOUNT-REPLACE-ME):instance-profile/[\w+=,.@-]+")
# Scopes under which a GCE VM's service account may write Cloud Storage objects.
GCS_WRITE_SCOPES = {
    "https://www.googleapis.com/auth/cloud-platform",
    "https://www.googleapis.com/auth/devstorage.read_write",
    "https://www.googleapis.com/auth/devstorage.full_control",
}


@pytest.mark.parametrize("name", LAUNCHER_CONFIGS)
def test_every_node_reaches_object_storage_through_its_own_identity(name):
    """Trials write from the node that trains them, so every node, not only the head, needs the bucket."""
    config = prepared(name)
    head_type = config["head_node_type"]
    for node_type, spec in config["available_node_types"].items():
        node = spec["node_config"]
        if config["provider"]["type"] == "aws":
            arn = node.get("IamInstanceProfile", {}).get("Arn", "")
            assert AWS_PROFILE_ARN.fullmatch(arn), f"{node_type}: no instance profile ({arn!r})"
        elif node_type == head_type and "serviceAccounts" not in node:
            # `ray up` gives the head its own service account, with Storage Object Admin on the project
            # (and the cloud-platform scope): enough for the driver's reads and writes.
            assert "roles/storage.objectAdmin" in ray_gcp_head_roles()
        else:
            (account,) = node["serviceAccounts"]
            assert account["email"].endswith(".iam.gserviceaccount.com"), node_type
            assert GCS_WRITE_SCOPES & set(account["scopes"]), f"{node_type} may not write to Cloud Storage"
    if config["provider"]["type"] == "aws":
        # The head launches the workers, so it holds EC2 rights the workers must not get: its own profile.
        profiles = {k: v["node_config"]["IamInstanceProfile"]["Arn"] for k, v in worker_types(config).items()}
        assert config["available_node_types"][head_type]["node_config"]["IamInstanceProfile"]["Arn"] not in (
            profiles.values()
        )


def run_with_fake_sudo(command: str, tmp_path: Path) -> list[str]:
    """Run a node's initialization command with `sudo` recorded instead of run (and /mnt/rayb not yet a
    mount point); what it asked sudo for."""
    fake = tmp_path / "bin"
    fake.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "sudo.log"
    for tool, script in {"sudo": f'echo "$*" >> {log}', "mountpoint": "exit 1"}.items():
        (fake / tool).write_text(f"#!/bin/sh\n{script}\n")
        (fake / tool).chmod(0o755)
    done = subprocess.run(
        ["bash", "-c", command], env=os.environ | {"PATH": f"{fake}:{os.environ['PATH']}"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("name", LAUNCHER_CONFIGS)
def test_shared_mount_alternative_is_off_by_default_and_mounts_every_node_when_set(name, tmp_path):
    config = prepared(name)
    provider = config["provider"]["type"]
    variable, share = {"aws": ("EFS_ID", "fs-0123456789abcdef0"), "gcp": ("FILESTORE", "10.0.0.2:/rayb")}[
        provider
    ]
    for node_type in config["available_node_types"]:
        # Every container still sees /mnt/rayb, so that setting the variable is all the alternative needs.
        _, options = docker_settings(config, node_type)
        assert f"-v {SHARED}:{SHARED}" in options, f"{node_type}'s container does not see {SHARED}"
        mounts = [c for c in init_commands(config, node_type) if re.search(rf"\bmount\b.*\s{SHARED}\b", c)]
        assert len(mounts) == 1, f"{node_type} has no shared-mount command for {SHARED}"
        (mount,) = mounts
        assert f"{variable}=;" in mount, f"{node_type}: the shared mount is not off by default"
        assert run_with_fake_sudo(mount, tmp_path / node_type / "off") == [], f"{node_type} mounts by default"
        calls = run_with_fake_sudo(
            mount.replace(f"{variable}=;", f"{variable}={share};"), tmp_path / node_type
        )
        (mounted,) = [c for c in calls if c.startswith("mount ")]
        assert mounted.endswith(f" {SHARED}"), mounted
        if provider == "aws":
            assert f"{share}.efs.{config['provider']['region']}.amazonaws.com:/" in mounted
        else:
            assert share in mounted


def ingress_rules(node: Any) -> Iterator[dict[str, Any]]:
    """Every firewall-like rule anywhere in a config: AWS IpPermissions entries, GCP firewall bodies."""
    if isinstance(node, dict):
        if "IpProtocol" in node or "sourceRanges" in node:
            yield node
        for value in node.values():
            yield from ingress_rules(value)
    elif isinstance(node, list):
        for value in node:
            yield from ingress_rules(value)


def public_ray_ports(rule: dict[str, Any]) -> set[int]:
    """The Ray ports that this rule opens to the whole internet."""
    cidrs = [
        r.get("CidrIp") or r.get("CidrIpv6") for r in rule.get("IpRanges", []) + rule.get("Ipv6Ranges", [])
    ]
    cidrs += rule.get("sourceRanges", [])
    if not any(ipaddress.ip_network(c, strict=False).prefixlen == 0 for c in cidrs if c):
        return set()
    if "IpProtocol" in rule:  # AWS: protocol "-1" means every protocol and port
        if str(rule["IpProtocol"]) in ("-1", "all"):
            return set(RAY_PORTS)
        low, high = rule.get("FromPort", -1), rule.get("ToPort", -1)
        return {p for p in RAY_PORTS if low == -1 or low <= p <= high}
    opened = set()
    for allowed in rule.get("allowed", []):  # GCP: no ports means all ports
        spans = [tuple(map(int, (s.split("-") * 2)[:2])) for s in allowed.get("ports", ["0-65535"])]
        opened |= {p for p in RAY_PORTS for low, high in spans if low <= p <= high}
    return opened


def test_public_port_detector_recognises_open_rules():
    open_aws = {"IpProtocol": "tcp", "FromPort": 8000, "ToPort": 9000, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}
    open_gcp = {"sourceRanges": ["0.0.0.0/0"], "allowed": [{"IPProtocol": "tcp", "ports": ["10001"]}]}
    ssh_only = {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}
    internal = {"IpProtocol": "-1", "IpRanges": [{"CidrIp": "10.0.0.0/8"}]}
    assert public_ray_ports(open_aws) == {8265}
    assert public_ray_ports(open_gcp) == {10001}
    assert public_ray_ports({"IpProtocol": "-1", "Ipv6Ranges": [{"CidrIpv6": "::/0"}]}) == set(RAY_PORTS)
    assert public_ray_ports(ssh_only) == public_ray_ports(internal) == set()


@pytest.mark.parametrize("name", LAUNCHER_CONFIGS)
def test_ray_ports_stay_private(name):
    raw = load_launcher(name)
    exposed = {json.dumps(rule): ports for rule in ingress_rules(raw) if (ports := public_ray_ports(rule))}
    assert not exposed, f"rules open Ray ports to the internet: {exposed}"
    # The dashboard binds the head's loopback; the `ray dashboard` SSH tunnel arrives there. Checked on the
    # prepared config: leaving the commands out would bring in Ray's defaults, which bind 0.0.0.0.
    start = " ".join(prepared(name)["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in start and "0.0.0.0" not in start


# ---------------------------------------------------------------------------------------------------------
# Credentials: none written down anywhere under cluster/


CREDENTIAL_PATTERNS = {
    "an AWS access key id": re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    "an AWS secret key": re.compile(
        r"(?i)aws_secret_access_key[\"']?\s*[:=]\s*[\"']?(?!\$)[A-Za-z0-9/+=]{40}(?![A-Za-z0-9/+=])"
    ),
    "a private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----|\"private_key\"\s*:"),
    "a Hugging Face token": re.compile(r"\bhf_[A-Za-z0-9]{30,}"),
    "a password in a URL": re.compile(r"://[^/\s:@$]+:[^/\s@$]+@"),
}


def literal_credentials(text: str) -> list[str]:
    return [what for what, pattern in CREDENTIAL_PATTERNS.items() if pattern.search(text)]


def test_credential_detector_recognises_literal_keys():
    key_id, secret = "AKIA" + "Q" * 16, "a1B2c3D4+e" * 4  # built here so that no scanner flags this file
    assert literal_credentials(f"IamInstanceProfile: {key_id}") == ["an AWS access key id"]
    assert literal_credentials(f"aws_secret_access_key = {secret}") == ["an AWS secret key"]
    assert literal_credentials(f"export AWS_SECRET_ACCESS_KEY={secret};") == ["an AWS secret key"]
    assert literal_credentials(f"--output s3://{key_id[:4]}user:{secret}@bucket/x") == ["a password in a URL"]
    assert literal_credentials('--from-literal=AWS_SECRET_ACCESS_KEY="$AWS_SECRET_ACCESS_KEY"') == []
    assert literal_credentials("--output s3://my-bucket/rayb") == []


CLUSTER_FILES = sorted(p.relative_to(REPO).as_posix() for p in CLUSTER.rglob("*") if p.is_file())


@pytest.mark.parametrize("path", [*CLUSTER_FILES, "docs/clusters.md", "jobs/submit_study.sh"])
def test_no_literal_credentials(path):
    assert not literal_credentials((REPO / path).read_text()), path


# ---------------------------------------------------------------------------------------------------------
# KubeRay (cluster/kuberay/raycluster.yaml, cluster/kuberay/rayjob.yaml)


def k8s_docs(name: str, text: str | None = None) -> list[dict[str, Any]]:
    text = (KUBERAY / name).read_text() if text is None else text
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def uncommented(name: str, pattern: str) -> str:
    """A manifest with the commented-out lines of an alternative (their text matches `pattern`) switched
    on, as docs/clusters.md tells the reader to do."""
    text, count = re.subn(rf"^(\s*)# ({pattern}.*)$", r"\1\2", (KUBERAY / name).read_text(), flags=re.M)
    assert count, f"{name} has no commented-out lines matching {pattern!r}"
    return text


def only(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def cluster_spec(name: str, text: str | None = None) -> dict[str, Any]:
    docs = k8s_docs(name, text)
    if name == "rayjob.yaml":
        return only(docs, "RayJob")["spec"]["rayClusterSpec"]
    return only(docs, "RayCluster")["spec"]


def cluster_specs() -> dict[str, dict[str, Any]]:
    return {name: cluster_spec(name) for name in ("raycluster.yaml", "rayjob.yaml")}


def pod_templates(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    templates = {"head": spec["headGroupSpec"]["template"]}
    templates |= {g["groupName"]: g["template"] for g in spec.get("workerGroupSpecs", [])}
    return templates


def ray_container(template: dict[str, Any]) -> dict[str, Any]:
    return template["spec"]["containers"][0]  # KubeRay runs Ray in the first container


def gpu_limit(template: dict[str, Any]) -> int:
    return int(ray_container(template).get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))


def walk(node: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


SPECS = ["raycluster.yaml", "rayjob.yaml"]


def test_manifests_parse_with_the_right_kinds():
    expected = {
        "raycluster.yaml": [("ray.io/v1", "RayCluster")],
        "rayjob.yaml": [("ray.io/v1", "RayJob")],
        # The shared-volume alternative, applied only by those who choose it: no claim (and no 1 TiB
        # network file system behind it) comes with the default manifests.
        "shared-volume.yaml": [("v1", "PersistentVolumeClaim")],
    }
    assert sorted(p.name for p in KUBERAY.glob("*.yaml")) == sorted(expected)
    for name, kinds in expected.items():
        assert [(d["apiVersion"], d["kind"]) for d in k8s_docs(name)] == kinds, name


def shared_claims(template: dict[str, Any]) -> dict[str, str]:
    """mount path → claim name of every PersistentVolumeClaim that a pod's Ray container mounts."""
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in template["spec"].get("volumes", [])
        if "persistentVolumeClaim" in v
    }
    return {
        m["mountPath"]: claims[m["name"]]
        for m in ray_container(template).get("volumeMounts", [])
        if m["name"] in claims
    }


@pytest.mark.parametrize("name", SPECS)
def test_pods_mount_no_shared_volume_by_default(name):
    for group, template in pod_templates(cluster_specs()[name]).items():
        assert shared_claims(template) == {}, f"{group} mounts a volume the default does not create"


@pytest.mark.parametrize("name", SPECS)
def test_shared_volume_alternative_is_read_write_many_and_mounted_by_every_pod(name):
    (claim,) = k8s_docs("shared-volume.yaml")
    assert "ReadWriteMany" in claim["spec"]["accessModes"]
    spec = cluster_spec(name, uncommented(name, r"- \{name: shared, "))
    for group, template in pod_templates(spec).items():
        assert shared_claims(template) == {SHARED: claim["metadata"]["name"]}, f"{group} lacks {SHARED}"


CREDENTIAL_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|CREDENTIAL", re.I)


@pytest.mark.parametrize("name", SPECS)
def test_pods_take_storage_credentials_from_a_secret_or_their_service_account(name):
    assert not [d for d in k8s_docs(name) if d["kind"] == "Secret"], "keys belong in a Secret made apart"
    for group, template in pod_templates(cluster_specs()[name]).items():
        container = ray_container(template)
        # Every pod, not only the head: trials write from the pod that trains them.
        refs = [e["secretRef"] for e in container.get("envFrom", []) if "secretRef" in e]
        assert refs == [{"name": STORAGE_SECRET, "optional": True}], group  # optional: workload identity
        literal = [
            e["name"] for e in container.get("env", []) if CREDENTIAL_NAME.search(e["name"]) and "value" in e
        ]
        assert not literal, f"{group}: {literal} written into the manifest; use the Secret"
    # The workload-identity alternative: one Kubernetes service account for every pod.
    spec = cluster_spec(name, uncommented(name, r"serviceAccountName: "))
    accounts = {group: t["spec"].get("serviceAccountName") for group, t in pod_templates(spec).items()}
    assert len(set(accounts.values())) == 1 and None not in accounts.values(), accounts


@pytest.mark.parametrize("name", SPECS)
def test_autoscaled_8_gpu_group_starting_at_zero(name):
    spec = cluster_specs()[name]
    assert spec["enableInTreeAutoscaling"] is True
    groups = spec["workerGroupSpecs"]
    gpu_groups = [g for g in groups if gpu_limit(g["template"])]
    assert len(gpu_groups) == 1
    (gpu,) = gpu_groups
    assert gpu_limit(gpu["template"]) == GPUS_PER_NODE
    assert gpu["maxReplicas"] >= 1
    assert {g["groupName"]: (g["minReplicas"], g.get("replicas", 0)) for g in groups} == {
        g["groupName"]: (0, 0) for g in groups
    }
    assert gpu_limit(spec["headGroupSpec"]["template"]) == 0
    assert spec["headGroupSpec"].get("rayStartParams", {}).get("num-gpus", "0") == "0"


@pytest.mark.parametrize("name", SPECS)
def test_pods_install_rayb_with_cuda_kernels_only_on_gpu_pods(name):
    for group, template in pod_templates(cluster_specs()[name]).items():
        container = ray_container(template)
        script = " ".join(container.get("command", []) + container.get("args", []))
        assert re.search(r"pip install .*\brayb\b", script), f"{group} never installs rayb"
        # Our script ends by starting Ray itself; without the annotation KubeRay would run its own
        # `ray start` after ours and the pod would start Ray twice.
        assert template["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
        assert script.rstrip().endswith("$KUBERAY_GEN_RAY_START_CMD"), group
        assert ("rayb[cuda]" in script) == bool(gpu_limit(template)), group
        assert "[cuda]" not in script or gpu_limit(template), group


@pytest.mark.parametrize("name", SPECS)
def test_ray_version_and_images_match_rayb_pin(name):
    spec = cluster_specs()[name]
    assert spec["rayVersion"] == ray_pin()
    for group, template in pod_templates(spec).items():
        assert_pinned_ray_image(ray_container(template)["image"], gpu=bool(gpu_limit(template)), where=group)


@pytest.mark.parametrize("name", SPECS)
def test_nothing_is_exposed_outside_the_kubernetes_cluster(name):
    docs = k8s_docs(name)
    public = [
        (k, v) for k, v in walk(docs) if k in ("type", "serviceType") and v in ("LoadBalancer", "NodePort")
    ]
    assert not public
    assert not [d for d in docs if d["kind"] in ("Service", "Ingress", "Route", "Gateway")]
    spec = cluster_specs()[name]
    assert spec["headGroupSpec"]["serviceType"] == "ClusterIP"
    assert spec["authOptions"]["mode"] == "token"  # the job API runs code: it needs a token as well


def test_raycluster_dashboard_is_reachable_only_through_port_forward():
    # kubectl port-forward arrives on the pod's loopback; nothing else in the cluster can reach 127.0.0.1.
    assert (
        cluster_specs()["raycluster.yaml"]["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    )


def test_rayjob_cluster_is_raycluster_except_where_the_operator_needs_the_dashboard():
    specs = {name: copy.deepcopy(spec) for name, spec in cluster_specs().items()}
    hosts = {
        name: spec["headGroupSpec"]["rayStartParams"].pop("dashboard-host") for name, spec in specs.items()
    }
    # The operator polls the job through the head Service and the submitter pod posts to it, so the
    # RayJob's dashboard must listen on the pod network; a loopback-only RayJob never finishes.
    assert hosts["rayjob.yaml"] == "0.0.0.0"
    assert specs["rayjob.yaml"] == specs["raycluster.yaml"], "rayjob.yaml's rayClusterSpec drifted"


def entrypoint_args() -> list[str]:
    return shlex.split(only(k8s_docs("rayjob.yaml"), "RayJob")["spec"]["entrypoint"])


def test_rayjob_runs_a_study_onto_object_storage_and_cleans_up():
    job = only(k8s_docs("rayjob.yaml"), "RayJob")["spec"]
    args = entrypoint_args()
    assert args[:2] == ["rayb", "run"]
    output = args[args.index("--output") + 1]
    assert re.fullmatch(r"(s3|gs)://[a-z0-9][a-z0-9.-]+[a-z0-9](/[^@\s]*)?", output), (
        f"--output {output} is not an s3:// or gs:// URI (without credentials in it)"
    )
    assert "--archive" not in args  # the outputs are on object storage already
    assert job["shutdownAfterJobFinishes"] is True
    assert isinstance(job["ttlSecondsAfterFinished"], int) and job["ttlSecondsAfterFinished"] > 0
    # The study file is resolved inside the working_dir, a snapshot of this repository.
    assert "working_dir" in yaml.safe_load(job["runtimeEnvYAML"])


def test_study_files_named_by_entrypoints_and_docs_exist_and_validate():
    from rayb.study import load_study

    docs = (REPO / "docs" / "clusters.md").read_text()
    named = {a for a in entrypoint_args() if re.fullmatch(r"configs/[\w./-]+\.ya?ml", a)}
    named |= set(re.findall(r"rayb (?:run|validate) (configs/[\w./-]+\.ya?ml)", docs))
    assert named, "no study file named"
    for path in sorted(named):
        assert (REPO / path).is_file(), f"{path} is named but does not exist"
        load_study(REPO / path)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ([], []),
        (["--eval-only"], ["--eval-only"]),
        (["gs://archive/rayb"], ["--archive", "gs://archive/rayb"]),
    ],
)
def test_submit_script_passes_an_object_storage_output_through(extra, expected, tmp_path):
    """jobs/submit_study.sh STUDY s3://... submits `rayb run STUDY --output s3://...` (not --archive)."""
    for tool, script in {"rayb": "exit 0", "ray": 'printf "%s\\n" "$@"'}.items():
        (tmp_path / tool).write_text(f"#!/bin/sh\n{script}\n")
        (tmp_path / tool).chmod(0o755)
    done = subprocess.run(
        [str(REPO / "jobs" / "submit_study.sh"), "configs/smoke.yaml", "s3://my-bucket/rayb", *extra],
        env=os.environ | {"PATH": f"{tmp_path}:{os.environ['PATH']}"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    args = done.stdout.splitlines()
    assert args[args.index("--") + 1 :] == [
        "rayb", "run", "configs/smoke.yaml", "--output", "s3://my-bucket/rayb", *expected
    ]  # fmt: skip
