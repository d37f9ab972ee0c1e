"""Launchers for a multi-node run on the engines people already run: an sbatch script that forms a
Ray cluster on a Slurm allocation (`slurm_script`), a KubeRay RayJob manifest (`rayjob_yaml`),
and plain `ray start` commands for a cluster made by hand (`ray_commands`).

Each takes a ResolvedEnv (its cluster record: nodes, GPUs per node, the interconnect's NCCL and
Gloo variables) and runs the image's own run script, rendered for that same world size; the
image's /etc/envbuild.json is checked against the launcher's cluster before Ray starts
(IMAGE_CHECK), so an image built for one node is refused, not run with the wrong batch sizes.
Every value is checked where it enters (the image reference, the SIF path, the job name) and
quoted where it leaves (quoting.sh for the shell, yaml.safe_dump for the manifest).
"""

from __future__ import annotations

import math
import os
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal

from envbuilder.errors import UserError
from envbuilder.record import Record
from envbuilder.render.image import RECORD  # (the image's own resolved environment)
from envbuilder.render.image import RUN_SCRIPT_PATH as RUN_SCRIPT  # (where the Dockerfile copies it)
from envbuilder.render.quoting import comment, sh

if TYPE_CHECKING:
    import yaml

    from envbuilder.model.matrix import Matrix
    from envbuilder.model.resolved import Overrides, ResolvedEnv

RAY_PORT = 6379  # Ray's default GCS port
RAY_WAIT = 300  # seconds the launchers wait for every GPU to join, unless ENVBUILD_RAY_WAIT
SLURM_HEADER = "# envbuild launch slurm"  # line 2 of every sbatch script this writes (1 is #!)
KUBERAY_HEADER = "# envbuild launch kuberay"  # line 1 of every RayJob manifest this writes
# `ray start` flags beside the address (one home for the sbatch script and `launch ray`):
# usage stats off (a cluster's nodes should not phone home), the node named as Slurm names it
RAY_QUIET = "--disable-usage-stats"

# Environment variables a docker container gets from the batch job (`--env NAME` passes the
# value only where it is set): NCCL and Gloo's, Ray's address and per-node `ray start` words,
# and the run script's own (templates/run_ppo_gsm8k.sh.j2). Apptainer passes the environment.
DOCKER_ENV = (
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "NCCL_DEBUG",
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "RAY_ADDRESS",
    "ENVBUILD_RAY_NODE_ARGS",
    "MODEL",
    "DATA_DIR",
    "GSM8K_FROM",
    "HF_ENDPOINT",
    "HF_TOKEN",
    "HF_HOME",
    "PYTORCH_CUDA_ALLOC_CONF",
)

# Where a node shows its IMEX channels (the NVIDIA IMEX service that multi-node NVLink, a GB200
# NVL72 domain, needs; vLLM's env_override.py looks for the same path)
IMEX_CHANNELS = "/dev/nvidia-caps-imex-channels"

# Run inside the image before Ray starts: its /etc/envbuild.json must describe the run this
# launcher forms (profile, nodes, GPUs per node, estimator, model), since the run script's batch
# sizes and trainer.nnodes were rendered for it. argv: record path, profile, nodes,
# gpus_per_node, algorithm, model, the build command that makes the right image.
IMAGE_CHECK = """\
import json, sys
path, fix = sys.argv[1], sys.argv[7]
want = dict(zip(("profile", "nodes", "gpus_per_node", "algorithm", "model"), sys.argv[2:7]))
try:
    with open(path) as f:
        d = json.load(f)
except (OSError, ValueError) as e:
    sys.exit(f"envbuild: the image has no readable {path} ({e}): it was not built by envbuild. "
             f"Build it with: {fix}")
cluster = d.get("cluster") or {"nodes": 1, "gpus_per_node": d["train"]["n_gpus"]}
got = {"profile": d.get("card") or d["profile"], "nodes": str(cluster["nodes"]),
       "gpus_per_node": str(cluster["gpus_per_node"]),
       "algorithm": (d.get("algorithm") or {"name": "gae"})["name"], "model": d["train"]["model"]}
wrong = [f"{k} {got[k]} (this job: {want[k]})" for k in want if got[k] != want[k]]
if wrong:
    print("envbuild: the image was rendered for another run: " + ", ".join(wrong) + ". The "
          "batch sizes and trainer.nnodes of its run script follow that; build the image with: "
          f"{fix}",
          file=sys.stderr)
    sys.exit(2)
"""

# Run inside the image on the head: wait until Ray sees `want` GPUs and every named node, or
# the deadline passes (exit 1, naming the nodes that did not join). The GCS port is tried with
# a plain socket first: ray.init waits minutes for a head that is not there. argv: address
# (HOST:PORT), GPUs wanted, seconds, the node names expected (none: count GPUs only).
RAY_WAITER = """\
import socket, sys, time
address, want, wait, names = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
deadline = time.monotonic() + wait
host, _, port = address.rpartition(":")
while True:
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
        break
    except OSError as e:
        if time.monotonic() > deadline:
            sys.exit(f"envbuild: no Ray head answers at {address} after {wait:.0f} s ({e}).")
        time.sleep(1)
import ray
ray.init(address=address, logging_level="ERROR", log_to_driver=False)
while True:
    alive = [n for n in ray.nodes() if n.get("Alive")]
    gpus = sum(n.get("Resources", {}).get("GPU", 0) for n in alive)
    joined = {n.get("NodeName") for n in alive}
    missing = [n for n in names if n not in joined]
    if gpus >= want and not missing:
        print(f"envbuild: Ray sees {gpus:g} GPUs on {len(alive)} node(s): "
              + " ".join(sorted(str(n) for n in joined)), flush=True)
        break
    if time.monotonic() > deadline:
        sys.exit(f"envbuild: after {wait:.0f} s Ray sees {gpus:g} of {want:g} GPUs on "
                 f"{len(alive)} node(s)"
                 + ("; these nodes did not join: " + " ".join(missing) if missing else "")
                 + ". Their `ray start` output is in the job log; raise ENVBUILD_RAY_WAIT "
                 "if they are only slow to start.")
    time.sleep(2)
"""


def shell_text(text: str) -> str:
    """A multi-line constant (IMAGE_CHECK, RAY_WAITER) as one bash word that reads as the code
    it holds: single quotes around the raw lines where it has no `'` and no control character
    but the line break, else quoting.sh's form."""
    if "'" in text or _CONTROL.search(text.replace("\n", "")):
        return sh(text)
    return f"'{text}'"


# -- values, checked where they enter ---------------------------------------------------------

# a Slurm job name: one plain token (it lands bare on an #SBATCH line, which has no quoting)
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# a Kubernetes object name (DNS-1123 label; KubeRay names the RayCluster and its pods after it,
# with suffixes, so shorter than the 63 a label may hold)
_K8S_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?")
# a PersistentVolumeClaim's name (DNS-1123 subdomain)
_CLAIM = re.compile(r"[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?")
# a Kubernetes label value: at most 63 characters, alphanumerics at both ends, '-', '_', '.' inside
_LABEL_VALUE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\x80-\x9f\u2028\u2029]")


def _shown(value: str) -> str:
    from envbuilder.text import shorten

    return repr(shorten(value, 80))


def job_name(value: str | None, profile: str, kubernetes: bool = False) -> str:
    """--job-name, or envbuild-PROFILE: a Slurm job name (one plain token) or, for KubeRay, a
    Kubernetes name (lower-case letters, digits and '-')."""
    name = value if value is not None else f"envbuild-{profile}"
    pattern = _K8S_NAME if kubernetes else _JOB_NAME
    if pattern.fullmatch(name):
        return name
    what = (
        "a Kubernetes name: lower-case letters, digits and '-', at most 40, starting and "
        "ending with a letter or digit"
        if kubernetes
        else "one plain token: letters, digits, '.', '_', '-', at most 64, starting with a letter or digit"
    )
    if value is None:
        raise UserError(
            f"Profile {profile!r} gives the job name {_shown(name)}, which is not "
            f"{what}. Pass --job-name NAME."
        )
    raise UserError(
        f"--job-name {_shown(name)} is not {what}: it lands in the "
        + ("manifest's metadata.name" if kubernetes else "#SBATCH line unquoted")
        + ". Pass a plain name such as envbuild-"
        + profile
        + "."
    )


def label_value(profile: str) -> str:
    """The profile as the manifest's `envbuild.io/profile` label value, which Kubernetes
    refuses (the whole RayJob with it) unless it is at most 63 characters of letters, digits,
    '-', '_' and '.', starting and ending with a letter or digit."""
    if _LABEL_VALUE.fullmatch(profile):
        return profile
    raise UserError(
        f"Profile {_shown(profile)} cannot be a Kubernetes label value (the RayJob's "
        "envbuild.io/profile label): at most 63 letters, digits, '-', '_' or '.', starting "
        "and ending with a letter or digit, or Kubernetes refuses the manifest. Rename the "
        "profile in your overlay."
    )


def image_reference(ref: str, digest: bool) -> str:
    """--image: a reference in Docker's grammar (image_archive.REFERENCE, envbuild's one
    grammar); with `digest`, one that names its manifest digest (a tag can move)."""
    from envbuilder.engines.archive import IMAGE_ID
    from envbuilder.oci.reference import REFERENCE

    text = ref.removeprefix("docker://")
    if len(text) > 512 or not (REFERENCE.fullmatch(text) or (not digest and IMAGE_ID.fullmatch(text))):
        raise UserError(
            f"--image {_shown(ref)} is not an image reference: give "
            "REGISTRY/NAME[:TAG]@sha256:DIGEST (lower-case path, 64 hex digits), as "
            "`envbuild build PROFILE --push REGISTRY` prints it."
        )
    if digest and "@sha256:" not in text:
        raise UserError(
            f"--image {_shown(ref)} names no digest: a tag can move, so the pods "
            "could run an image other than the one envbuild built and tested. Pass "
            "REGISTRY/NAME@sha256:DIGEST as `envbuild build PROFILE --push REGISTRY` "
            "prints it (or `docker inspect --format '{{index .RepoDigests 0}}' "
            "IMAGE`)."
        )
    return text


def sif_path(path: str) -> str:
    """--sif as an absolute path (every node opens it: the batch script may start elsewhere);
    a control character, which no path a user types holds, is refused. Spaces and quotes are
    fine: the path is one quoted word of the script."""
    if not path:
        raise UserError("--sif is empty: give the .sif file `apptainer build` made.")
    if _CONTROL.search(path):
        raise UserError(
            f"--sif {_shown(path)} holds a control character (a line break, an "
            "escape): rename the file to a plain path."
        )
    return os.path.abspath(path)


# a host name: dot-separated labels of letters, digits and '-' (none empty, none ending in '-')
_HOST = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


def head_address(value: str) -> str:
    """--head-ip: an IPv4 or IPv6 address (as `ipaddress` reads it) or a host name, nothing a
    shell would read."""
    import ipaddress

    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if ":" in value or re.fullmatch(r"[0-9.]+", value) or not _HOST.fullmatch(value):
        raise UserError(
            f"--head-ip {_shown(value)} is not an address or host name (an IPv4 or IPv6 "
            "address, or labels of letters, digits and '-' joined by single dots)."
        )
    return value


def claim_name(value: str) -> str:
    if not _CLAIM.fullmatch(value):
        raise UserError(
            f"--data-pvc {_shown(value)} is not a PersistentVolumeClaim name "
            "(lower-case letters, digits, '-' and '.')."
        )
    return value


# -- what every launcher shares ------------------------------------------------------------------


def build_command(env: ResolvedEnv) -> str:
    """The `envbuild build` line that makes the image this launcher's run needs: the overrides
    the launcher was given, with the world size spelled out."""
    from envbuilder.model.flags import words

    given = words(env.overrides, nodes=env.cluster.nodes, gpus_per_node=env.cluster.gpus_per_node)
    return shlex.join(["envbuild", "build", env.asked, *given])


def check_args(env: ResolvedEnv) -> list[str]:
    """IMAGE_CHECK's arguments after the record's path."""
    return [
        env.asked,
        str(env.cluster.nodes),
        str(env.cluster.gpus_per_node),
        env.algorithm.name,
        env.train.model,
        build_command(env),
    ]


def describe(env: ResolvedEnv) -> str:
    cl = env.cluster
    return (
        f"{env.asked} on {cl.nodes} node(s) x {cl.gpus_per_node} GPU(s) ({env.gpu.name}), "
        f"verl {env.verl.version}, {env.algorithm.name}" + (f", {cl.interconnect}" if cl.interconnect else "")
    )


def imex_lines(env: ResolvedEnv) -> list[str]:
    """Shell lines that export the release's NCCL settings for these GPUs (the cluster's
    `without_imex`, verl.yaml `nccl_env`) on a node without IMEX channels, unless set; none
    where the release gives these GPUs none."""
    settings = env.cluster.without_imex
    if not settings:
        return []
    exports = " ".join(f"{k}=${{{k}:-{sh(v)}}}" for k, v in settings.items())
    return [
        f"# verl {comment(env.verl.version)}'s NCCL settings for {comment(env.gpu.name)} (its _gb200_nccl_env): NVLink",
        "# SHARP and multi-node NVLink need IMEX channels; without them NCCL fails (error 801)",
        f"if [ ! -e {sh(IMEX_CHANNELS)} ]; then",
        f"  export {exports}",
        "fi",
    ]


class NodeVar(Record):
    """A variable of the run script's own that Ray's workers need on every node: its name, the
    value the run script gives it, and how an exported value meets it: ":-" an exported value
    wins unless empty (`${NAME:-v}`), "-" an exported one wins even empty (empty turns it off),
    "" none does (the run script sets it outright)."""

    name: str
    value: str
    form: Literal[":-", "-", ""] = ":-"

    def export(self) -> str:
        if not self.form:
            return f"export {self.name}={sh(self.value)}"
        return f"export {self.name}=${{{self.name}{self.form}{sh(self.value)}}}"


def node_env(env: ResolvedEnv) -> list[NodeVar]:
    """What the rendered run script exports for its workers (templates/run_ppo_gsm8k.sh.j2:
    the hub, vLLM's compile cache, torch.compile off below Triton's floor, the allocator's
    expandable segments). On one node verl's own `ray.init` starts Ray from that shell, so its
    workers inherit them; on a cluster started by `ray start` the workers inherit the raylet's
    environment instead, and verl hands them none of the launching shell's, so every node's
    `ray start` needs them (issue 49: a two-node run's workers had no expandable segments)."""
    out = [NodeVar("HF_ENDPOINT", env.huggingface)]
    cc = env.vllm.compile_cache if env.vllm else None
    if cc is not None:
        out.append(NodeVar(cc.env, cc.value))
    if not env.features.torch_compile:
        out.append(NodeVar("TORCHDYNAMO_DISABLE", "1", ""))
    if env.cuda_alloc_conf is not None and env.cuda_alloc_conf.value:
        out.append(NodeVar("PYTORCH_CUDA_ALLOC_CONF", env.cuda_alloc_conf.value, "-"))
    return out


def ray_head_args(ip: str, port: str, gpus: str) -> list[str]:
    return ["--head", f"--node-ip-address={ip}", f"--port={port}", f"--num-gpus={gpus}", RAY_QUIET]


def ray_worker_args(ip: str, port: str, gpus: str) -> list[str]:
    return [f"--address={ip}:{port}", f"--num-gpus={gpus}", RAY_QUIET]


# -- Slurm ---------------------------------------------------------------------------------------


def slurm_script(
    env: ResolvedEnv, *, sif: str | None = None, image: str | None = None, job: str | None = None
) -> str:
    """The sbatch script for `env` (sif: an Apptainer image's path, or image: a docker
    reference; each checked here too, for a caller that is not the CLI)."""
    from envbuilder.render.files import jinja_env

    if (sif is None) == (image is None):
        raise UserError(
            "Pass the image the nodes run: --sif PATH (an Apptainer image, from "
            "`envbuild apptainer`) or --image REF (docker), not both."
        )
    sif = sif_path(sif) if sif is not None else None
    image = image_reference(image, digest=False) if image is not None else None
    cl = env.cluster
    bash = {"ip": '"$head_ip"', "port": '"$ray_port"', "gpus": '"$gpus_per_node"'}
    context = {
        "d": env,
        "header": SLURM_HEADER,
        "describe": describe(env),
        "job_name": job_name(job, env.asked),
        "runtime": "apptainer" if sif else "docker",
        "image": sif or image,
        "nodes": cl.nodes,
        "gpus_per_node": cl.gpus_per_node,
        "env": dict(cl.env),
        "node_exports": [var.export() for var in node_env(env)],
        "interface": cl.interface,
        "docker_env": sorted(
            set(DOCKER_ENV) | set(cl.env) | set(cl.without_imex or {}) | {var.name for var in node_env(env)}
        ),
        "imex_lines": imex_lines(env),
        "run_script": RUN_SCRIPT,
        "record": RECORD,
        "ray_port": RAY_PORT,
        "ray_wait": RAY_WAIT,
        "image_check": shell_text(IMAGE_CHECK),
        "check_args": check_args(env),
        "waiter": shell_text(RAY_WAITER),
        "head_args": ray_head_args(**bash),
        "worker_args": ray_worker_args(**bash),
    }
    return jinja_env().get_template("launch/slurm.sbatch.j2").render(context)


# -- KubeRay --------------------------------------------------------------------------------------


def pod_sizes(
    env: ResolvedEnv, cpus: int | None, memory_gib: int | None, shm_gib: int | None
) -> tuple[int, int, int]:
    """CPUs, memory and /dev/shm (GiB) of each pod: by default 8 CPUs and 32 GiB per GPU, and
    /dev/shm 30% of the memory, which is what Ray's object store takes by default (capped by
    /dev/shm's size); a memory-backed emptyDir counts against the pod's memory limit."""
    g = env.cluster.gpus_per_node
    cpus = cpus or 8 * g
    memory_gib = memory_gib or 32 * g
    shm_gib = shm_gib or max(1, math.ceil(memory_gib * 0.3))
    if shm_gib >= memory_gib:
        raise UserError(
            f"--shm-gib {shm_gib} is not below --memory-gib {memory_gib}: /dev/shm "
            "is memory the pod's limit counts, and the processes need the rest. "
            "Give it about 30% of the memory."
        )
    return cpus, memory_gib, shm_gib


def rayjob(
    env: ResolvedEnv,
    image: str,
    *,
    job: str | None = None,
    cpus: int | None = None,
    memory_gib: int | None = None,
    shm_gib: int | None = None,
    data_pvc: str | None = None,
) -> dict[str, object]:
    """The RayJob (KubeRay ray.io/v1) for `env`, as plain data: a head pod and N-1 worker pods,
    each one whole GPU node (G GPUs), so the N nodes the run script was rendered for are the N
    pods Ray sees; the job runs the image's run script on the head once Ray sees every GPU."""
    cl = env.cluster
    image = image_reference(image, digest=True)
    cpus, memory_gib, shm_gib = pod_sizes(env, cpus, memory_gib, shm_gib)
    label = label_value(env.profile)  # (before the job's name, which --job-name can fix)
    name = job_name(job, env.asked, kubernetes=True)
    # (the run script's own variables too: Ray's workers on each pod inherit the pod's, not the
    # entrypoint's; node_env)
    variables = {
        **dict(cl.env),
        **{var.name: var.value for var in node_env(env)},
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    if data_pvc is not None:
        variables.update(DATA_DIR="/data/gsm8k", HF_HOME="/data/huggingface")
    resources = {"cpu": str(cpus), "memory": f"{memory_gib}Gi", "nvidia.com/gpu": str(cl.gpus_per_node)}
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_gib}Gi"}}]
    if data_pvc is not None:
        mounts.append({"name": "data", "mountPath": "/data"})
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": claim_name(data_pvc)}})

    def template(container: str) -> dict[str, object]:
        return {
            "spec": {
                "containers": [
                    {
                        "name": container,
                        "image": image,
                        "env": [{"name": k, "value": str(v)} for k, v in sorted(variables.items())],
                        "resources": {"limits": dict(resources), "requests": dict(resources)},
                        "volumeMounts": [dict(m) for m in mounts],
                    }
                ],
                "volumes": [dict(v) for v in volumes],
            }
        }

    start = {"num-gpus": str(cl.gpus_per_node)}
    cluster: dict[str, object] = {
        "headGroupSpec": {"rayStartParams": dict(start), "template": template("ray-head")}
    }
    if cl.nodes > 1:
        workers = cl.nodes - 1
        cluster["workerGroupSpecs"] = [
            {
                "groupName": "gpu-workers",
                "replicas": workers,
                "minReplicas": workers,
                "maxReplicas": workers,
                "rayStartParams": dict(start),
                "template": template("ray-worker"),
            }
        ]
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/created-by": "envbuild", "envbuild.io/profile": label},
        },
        "spec": {
            "entrypoint": entrypoint(env),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 300,  # (the cluster's logs stay readable for 5 minutes)
            "backoffLimit": 0,
            "rayClusterSpec": cluster,
        },
    }


def entrypoint(env: ResolvedEnv) -> str:
    """The RayJob's entrypoint (a shell command Ray's job manager runs on the head): the image
    check, the wait for every GPU, then the run script."""
    cl = env.cluster
    check = shlex.join(["python3", "-c", IMAGE_CHECK, RECORD, *check_args(env)])
    # (RAY_ADDRESS: the GCS address Ray's job supervisor gives an entrypoint)
    wait = (
        shlex.join(["python3", "-c", RAY_WAITER])
        + f' "${{RAY_ADDRESS:-127.0.0.1:{RAY_PORT}}}" {cl.nodes * cl.gpus_per_node}'
        + f' "${{ENVBUILD_RAY_WAIT:-{RAY_WAIT}}}"'
    )
    return f"{check} && {wait} && exec {shlex.quote(RUN_SCRIPT)}"


def rayjob_yaml(
    env: ResolvedEnv,
    image: str,
    *,
    job: str | None = None,
    cpus: int | None = None,
    memory_gib: int | None = None,
    shm_gib: int | None = None,
    data_pvc: str | None = None,
) -> str:
    """The manifest as YAML (a serializer's, with a comment header of envbuild's own), multi-line
    strings (the entrypoint's Python) as literal blocks."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(
            self, data: object
        ) -> bool:  # (the pods' equal parts written out, not as &anchors)
            return True

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    doc = rayjob(env, image, job=job, cpus=cpus, memory_gib=memory_gib, shm_gib=shm_gib, data_pvc=data_pvc)
    body = yaml.dump(
        doc, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=100, allow_unicode=False
    )
    head = [
        f"{KUBERAY_HEADER}: {comment(describe(env))}",
        f"# Rendered by envbuild {comment(env.envbuild_version)}. Apply: kubectl apply -f FILE;"
        " follow: kubectl logs -f job/" + job_name(job, env.asked, kubernetes=True),  # (its metadata.name)
        f"# The image must be built for this run: {comment(build_command(env))} --push REGISTRY",
    ]
    return "\n".join(head) + "\n" + body


# -- by hand ----------------------------------------------------------------------------------------


def ray_commands(env: ResolvedEnv, *, head_ip: str | None = None, port: int = RAY_PORT) -> str:
    """Plain shell lines for a Ray cluster made by hand: what every node exports, `ray start` on
    the head and on each other node, and the run on the head."""
    cl = env.cluster
    lines = [
        f"# envbuild launch ray: {comment(describe(env))}",
        "# Run these in the image on each node (apptainer exec --nv IMAGE.sif bash, or docker",
        ("# run --gpus all --network host --ipc host -it IMAGE bash), or beside a rendered run script."),
        f"HEAD_IP={sh(head_ip)}"
        if head_ip
        else "HEAD_IP=${HEAD_IP:?set HEAD_IP to the address the other nodes reach the head at}",
    ]
    lines.append(
        "# 1. on every node, before `ray start` (Ray's workers inherit it, and verl hands them "
        "nothing of the shell that runs step 4; a value you export wins):"
    )
    lines += [f"export {k}=${{{k}:-{sh(v)}}}" for k, v in cl.env.items()]
    lines += [var.export() for var in node_env(env)]
    if cl.interface:
        lines += [
            (
                "iface=$(awk '$2 == \"00000000\" {print $1; exit}' /proc/net/route)  "
                "# the default route's interface"
            ),
            (
                "export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-$iface} "
                "GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-$iface}"
            ),
        ]
    lines += imex_lines(env)
    ip, p, g = '"$HEAD_IP"', str(port), str(cl.gpus_per_node)
    # (an IPv6 address joins its port in brackets: [::1]:6379)
    v6 = bool(head_ip and ":" in head_ip)
    joined = '"[$HEAD_IP]"' if v6 else ip
    lines += [
        "# 2. on the head node:",
        shlex.join(["ray", "start"]) + " " + " ".join(ray_head_args(ip, p, g)),
    ]
    if cl.nodes > 1:
        lines += [
            f"# 3. on each of the other {cl.nodes - 1} node(s):",
            "ray start " + " ".join(ray_worker_args(joined, p, g)),
        ]
    lines += [
        f"# 4. on the head, in the container of its `ray start` (Ray's sockets are in its "
        f"/tmp), once `ray status` shows {cl.nodes * cl.gpus_per_node} GPUs; the image must "
        "be built for this run: " + comment(build_command(env)),
        f'RAY_ADDRESS="{"[$HEAD_IP]" if v6 else "$HEAD_IP"}:{p}" {sh(RUN_SCRIPT)}',
    ]
    return "\n".join(lines) + "\n"


def default_out(kind: str, profile: str) -> Path:
    return Path(f"{profile}.sbatch" if kind == "slurm" else f"{profile}.rayjob.yaml")


# -- the commands' whole work (envbuild launch slurm|kuberay|ray), callable without click ---------


def resolved(m: Matrix, profile: str, overrides: Overrides | None) -> ResolvedEnv:
    """`profile` resolved for a launcher, without the endpoints' user:password@ (nothing this
    writes or prints carries a credential)."""
    from envbuilder.model import mirrors as M
    from envbuilder.model.resolve import resolve

    return M.split_credentials(resolve(m, profile, overrides))[0]


def ours(path: Path, header: str, line: int) -> bool:
    """Whether `path` is a file this module wrote: its line `line` (0-based) starts with `header`."""
    from envbuilder.limits import open_regular

    try:
        with open_regular(path, follow=False) as f:
            head = f.read(4096).split(b"\n")
    except (OSError, ValueError):
        return False
    return len(head) > line and head[line].startswith(header.encode())


def out_path(out: str | None, kind: str, profile: str) -> Path:
    """Where -o says (refused when empty: Path('') is the current folder), else default_out."""
    from envbuilder.render.outdir import folder_name

    if out is not None and not out:
        raise UserError("-o is empty: give a file name.")
    return Path(out) if out else default_out(kind, folder_name(profile, "The profile name"))


def write_launcher(path: Path, text: str, header: str, line: int, force: bool, what: str) -> None:
    from envbuilder.render.outdir import write_owned_file

    ours_ = lambda p: ours(p, header, line)  # noqa: E731
    write_owned_file(path, text, ours_, force=force, what=what, mark=f"no {header!r} line")


def write_slurm(
    m: Matrix,
    profile: str,
    overrides: Overrides | None,
    *,
    sif: str | None = None,
    image: str | None = None,
    job: str | None = None,
    out: str | None = None,
    force: bool = False,
    say: Callable[[str], object] = print,
) -> Path:
    """`envbuild launch slurm`: the sbatch script of `profile` written to `out` (default
    ./PROFILE.sbatch); exactly one of `sif` (Apptainer) and `image` (docker) names what runs."""
    if (sif is None) == (image is None):
        raise UserError(
            "Pass the image the nodes run: --sif PATH (Apptainer) or --image REF (docker), one of them."
        )
    sif = sif_path(sif) if sif is not None else None
    image = image_reference(image, digest=False) if image is not None else None
    env = resolved(m, profile, overrides)
    job = job_name(job, env.asked)
    path = out_path(out, "slurm", env.asked)
    write_launcher(
        path, slurm_script(env, sif=sif, image=image, job=job), SLURM_HEADER, 1, force, "sbatch script"
    )
    if sif and not Path(sif).exists():
        say(f"note: {sif} does not exist here; every node must read it there.")
    say(f"wrote {path}: submit it with `sbatch {path}` (the image must be built with `{build_command(env)}`)")
    return path


def write_kuberay(
    m: Matrix,
    profile: str,
    overrides: Overrides | None,
    *,
    image: str,
    job: str | None = None,
    cpus: int | None = None,
    memory_gib: int | None = None,
    shm_gib: int | None = None,
    data_pvc: str | None = None,
    out: str | None = None,
    force: bool = False,
    say: Callable[[str], object] = print,
) -> Path:
    """`envbuild launch kuberay`: the RayJob manifest of `profile` written to `out` (default
    ./PROFILE.rayjob.yaml), the pushed `image` by digest."""
    image = image_reference(image, digest=True)
    env = resolved(m, profile, overrides)
    job_name(job, env.asked, kubernetes=True)
    path = out_path(out, "kuberay", env.asked)
    text = rayjob_yaml(
        env, image, job=job, cpus=cpus, memory_gib=memory_gib, shm_gib=shm_gib, data_pvc=data_pvc
    )
    write_launcher(path, text, KUBERAY_HEADER, 0, force, "manifest")
    if env.cluster.nodes > 1 and data_pvc is None:
        say(
            "note: verl reads the data set on the node its driver task lands on; give "
            "every pod the same data (--data-pvc CLAIM, or DATA_DIR on shared storage)."
        )
    say(f"wrote {path}: start it with `kubectl apply -f {path}`")
    return path


def ray_text(
    m: Matrix, profile: str, overrides: Overrides | None, *, head_ip: str | None = None, port: int = RAY_PORT
) -> str:
    """`envbuild launch ray`: the `ray start` commands of `profile` (ray_commands)."""
    head_ip = head_address(head_ip) if head_ip is not None else None
    return ray_commands(resolved(m, profile, overrides), head_ip=head_ip, port=port)
