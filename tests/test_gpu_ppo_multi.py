"""bench/gpu_ppo.py run --nodes N (issue 49), where no GPU is: the node layout a multi-GPU device
run forms on one host from the words `envbuild launch ray` prints, against a real render and a
real launcher text.

- The dry run (`--dry-run --no-prepare`): each node's command is the launcher's own `ray start`
  line (as bash expands it) plus only the words two raylets on one host need (a temp dir and ports
  of its own, --block); GPUs 0-3 and 4-7; NVLink multicast off on every node; refusals (exit 2)
  where the GPUs, the render's world or the launcher's --num-gpus do not fit, and without GPUs
  unless it is a dry run. nvidia-smi is a stand-in on PATH that lists the GPUs a test gives it.
- The real cluster (exclusive, like tests/test_launch.py's): the harness starts the two Ray nodes
  on loopback with the launcher's --num-gpus as logical resources, runs a stand-in run script
  on the head that reports what Ray holds and what each node's workers see, and stops every
  process it marked; the stand-in nvidia-smi's per-GPU lines reach the record's smi.per_gpu."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import bench_module, resolved
from test_launch import RAY_SHARED_HOST

ROOT = Path(__file__).resolve().parent.parent
GPU_PPO = ROOT / "bench" / "gpu_ppo.py"
BIN = Path(sys.executable).parent  # the test interpreter's venv: python3 with ray
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
H100_MIB = 81559

# nvidia-smi as gpu_ppo asks it: the GPUs' names and memory, their compute capability, and every
# 0.5 s each GPU's memory in use (GPU i: (i + 1) x 1000 MiB); FAKE_GPUS of them (0: none listed)
NVIDIA_SMI = r"""#!/bin/bash
n=${FAKE_GPUS:-8}
[ "$n" -gt 0 ] || { echo "No devices were found" >&2; exit 6; }
case "$*" in
  *--query-gpu=name,memory.total,driver_version*)
    for ((i = 0; i < n; i++)); do echo "NVIDIA H100 80GB HBM3, 81559, 580.159.04"; done ;;
  *--query-gpu=compute_cap*)
    for ((i = 0; i < n; i++)); do echo "9.0"; done ;;
  *--query-gpu=index,memory.used*)
    while :; do
      for ((i = 0; i < n; i++)); do echo "$i, $(( (i + 1) * 1000 ))"; done
      sleep 0.5
    done ;;
  *) exit 9 ;;
esac
"""


@pytest.fixture
def multi(tmp_path, cli):
    """The real render of h100 on 2 nodes x 4 GPUs, the launcher text `envbuild launch ray`
    prints for it, a stand-in nvidia-smi, and a runner of gpu_ppo.py (a subprocess, as on the
    device) that returns (rc, record, stdout, stderr)."""
    code, _, err = cli(
        "render", "h100", "--nodes", "2", "--gpus-per-node", "4", "--model", MODEL, "-o", tmp_path / "r"
    )
    assert code == 0, err
    render = tmp_path / "r" / "h100"
    launch = ["launch", "ray", "h100", "--nodes", "2", "--gpus-per-node", "4", "--head-ip", "127.0.0.1"]
    code, text, err = cli(*launch)
    assert code == 0, err
    launcher = tmp_path / "launcher.txt"
    launcher.write_text(text)
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(NVIDIA_SMI)
    (fake / "nvidia-smi").chmod(0o755)

    def run(*args, gpus=8, launcher_file=launcher, render_dir=render, env=None, timeout=120):
        cmd = [
            sys.executable,
            str(GPU_PPO),
            "run",
            "--render",
            str(render_dir),
            "--site",
            str(tmp_path / "site"),
        ]
        cmd += ["--out", str(tmp_path / "out"), "--case", "multi", "--work", str(tmp_path / "work")]
        cmd += ["--no-prepare", "--assume-total-mib", str(H100_MIB)]
        if launcher_file:
            cmd += ["--launcher", str(launcher_file)]
        full = dict(os.environ, PATH=f"{fake}:{BIN}:/usr/bin:/bin", FAKE_GPUS=str(gpus), **(env or {}))
        r = subprocess.run(
            [*cmd, *args], env=full, cwd=tmp_path, capture_output=True, text=True, timeout=timeout
        )
        path = tmp_path / "out" / "multi.json"
        rec = json.loads(path.read_text()) if path.exists() else None
        return r.returncode, rec, r.stdout, r.stderr

    run.render, run.launcher, run.tmp, run.cli, run.cleanup = render, launcher, tmp_path, cli, []
    yield run
    for folder in run.cleanup:
        shutil.rmtree(folder, ignore_errors=True)


def launcher_lines(text: str) -> tuple[list[str], list[str]]:
    """The head's and the other nodes' `ray start` words in the launcher's text, read here on
    their own (HEAD_IP substituted by hand), to hold the harness's bash expansion to."""
    ip = next(line.split("=", 1)[1] for line in text.splitlines() if line.startswith("HEAD_IP="))
    starts = [
        shlex.split(line.replace("$HEAD_IP", ip))
        for line in text.splitlines()
        if line.startswith("ray start ")
    ]
    head = [w for w in starts if "--head" in w]
    worker = [w for w in starts if "--head" not in w]
    assert len(head) == len(worker) == 1, starts
    return head[0], worker[0]


def test_the_dry_run_starts_each_node_with_the_launchers_own_words_and_its_own_gpus(multi):
    rc, rec, out, err = multi("--dry-run", "--nodes", "2", "--n-gpus", "4")
    assert rc == 0, err
    assert rec["status"] == "dry-run" and rec["prepared"] is False
    lay = rec["layout"]
    assert (lay["nodes"], lay["gpus_per_node"], lay["visible_gpus"], lay["assumed_gpus"]) == (2, 4, 8, False)
    head, worker = launcher_lines(multi.launcher.read_text())
    assert head[:3] == ["ray", "start", "--head"] and "--num-gpus=4" in head and "--port=6379" in head
    assert "--address=127.0.0.1:6379" in worker
    nodes = lay["node_list"]
    assert [n["role"] for n in nodes] == ["head", "worker"]
    assert [n["env"]["CUDA_VISIBLE_DEVICES"] for n in nodes] == ["0,1,2,3", "4,5,6,7"]
    assert [n["gpus"] for n in nodes] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    added = []
    for node, words in zip(nodes, (head, worker)):
        # the launcher's words first, exactly; then only a temp dir, ports and --block
        assert node["launcher_words"] == words
        assert node["argv"][: len(words)] == words
        extra = node["argv"][len(words) :]
        assert extra[-1] == "--block"
        assert {w.split("=")[0] for w in extra[:-1]} == {
            "--temp-dir",
            "--node-manager-port",
            "--object-manager-port",
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--metrics-export-port",
            "--runtime-env-agent-port",
            "--min-worker-port",
            "--max-worker-port",
        }, extra
        added.append(dict(w.split("=", 1) for w in extra[:-1]))
        # NVLink multicast off where Ray's workers inherit it, and the launcher's NCCL settings
        env = node["env"]
        assert env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
        assert env["NVSHMEM_DISABLE_NVLS"] == "1" and env["NCCL_IB_DISABLE"] == "1"
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] != ""
        assert env["ENVBUILD_GPU_PPO_MARK"] == lay["marker"]
    assert added[0]["--temp-dir"] != added[1]["--temp-dir"]
    assert all(len(a["--temp-dir"]) < 40 for a in added)  # (Ray's socket paths: 107 bytes at most)

    def ports(a: dict) -> set[int]:
        fixed = {int(v) for k, v in a.items() if k.endswith("-port") and "worker" not in k}
        return fixed | set(range(int(a["--min-worker-port"]), int(a["--max-worker-port"]) + 1))

    assert not ports(added[0]) & ports(added[1])
    assert 6379 not in ports(added[0]) | ports(added[1])  # (the head's GCS port, the launcher's)
    assert lay["ray_address"] == "127.0.0.1:6379" and lay["head_port"] == 6379
    assert "NCCL_NVLS_ENABLE=0" in out and "CUDA_VISIBLE_DEVICES=4,5,6,7" in out
    assert rec["plan"]["cluster"]["nodes"] == 2 and rec["plan"]["peak_gib"] > 0
    # every variable the run script exports for its workers, the launcher gives each node too
    # (engines/launch.node_env): the allocator's expandable segments reach a two-node run's workers
    assert "PYTORCH_CUDA_ALLOC_CONF" in rec["script_exports"]
    assert rec["script_exports_not_on_nodes"] == [], rec["script_exports_not_on_nodes"]


def test_without_gpus_only_the_dry_run_passes(multi):
    rc, rec, _, err = multi("--dry-run", "--nodes", "2", "--n-gpus", "4", gpus=0)
    assert rc == 0, err
    assert rec["layout"]["assumed_gpus"] is True and rec["layout"]["visible_gpus"] == 8
    assert rec["gpus"] == []
    rc, rec, _, err = multi("--nodes", "2", "--n-gpus", "4", gpus=0)
    assert rc == 2 and rec["status"] == "bad-layout", err
    assert "lists no GPU" in err and "ray_cluster" not in rec


@pytest.mark.parametrize(
    ("gpus", "args", "says"),
    [
        (6, ["--n-gpus", "4"], "--n-gpus 4 x --nodes 2 = 8 GPUs, but 6 are listed"),
        (7, [], "7 GPUs do not divide into 2 equal nodes"),
        (8, ["--n-gpus", "2"], "the render is for 2 node(s) x 4 GPU(s), this run 2 x 2"),
        (4, [], "the render is for 2 node(s) x 4 GPU(s), this run 2 x 2"),
    ],
)
def test_a_layout_that_does_not_fit_is_refused(multi, gpus, args, says):
    rc, rec, _, err = multi("--dry-run", "--nodes", "2", *args, gpus=gpus)
    assert rc == 2 and rec["status"] == "bad-layout", err
    assert says in err and says in rec["error"]
    assert "layout" not in rec


def test_the_launcher_must_be_the_renders_world_and_present(multi):
    code, text, _ = multi.cli(
        "launch", "ray", "h100", "--nodes", "2", "--gpus-per-node", "2", "--head-ip", "127.0.0.1"
    )
    assert code == 0
    other = multi.tmp / "launcher-2x2.txt"
    other.write_text(text)
    rc, _, _, err = multi("--dry-run", "--nodes", "2", "--n-gpus", "4", launcher_file=other)
    assert rc == 2 and "the launcher's head line declares --num-gpus=2, this run 4 a node" in err
    rc, _, _, err = multi("--dry-run", "--nodes", "2", "--n-gpus", "4", launcher_file=None)
    assert rc == 2 and "--nodes above 1 needs --launcher FILE" in err
    # one node: the run script starts its own Ray; a launcher there is a mistake
    rc, _, _, err = multi("--dry-run")
    assert rc == 2 and "--launcher is for --nodes above 1" in err
    # (a text that is no launcher's)
    junk = multi.tmp / "junk.txt"
    junk.write_text("echo hello\n")
    rc, _, _, err = multi("--dry-run", "--nodes", "2", "--n-gpus", "4", launcher_file=junk)
    assert rc == 2 and "no `ray start --head` line" in err


def test_one_node_stays_as_it_was(multi):
    """--nodes 1 (the default): no layout, no Ray started by the harness."""
    rc, rec, out, err = multi("--dry-run", launcher_file=None)
    assert rc == 0, err
    assert rec["status"] == "dry-run" and "layout" not in rec and "ray start" not in out


# -- a real two-node cluster on loopback ----------------------------------------------------------

# the stand-in run script: what Ray holds, and what a task that takes a node's every GPU sees on
# each node (its CUDA_VISIBLE_DEVICES, from that node's group) and of NCCL's settings
TRAINER = r"""#!/bin/bash
set -euo pipefail
echo "N_GPUS=$N_GPUS NNODES=$NNODES RAY_ADDRESS=$RAY_ADDRESS"
exec python3 - "$@" <<'PY'
import json, os, sys, time
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
per_node = int(os.environ["N_GPUS"])

@ray.remote(num_cpus=0)
def seen():
    keys = ("CUDA_VISIBLE_DEVICES", "NCCL_NVLS_ENABLE", "NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME",
            "ENVBUILD_GPU_PPO_MARK")
    return {k: os.environ.get(k) for k in keys}

alive = [n for n in ray.nodes() if n["Alive"]]
workers = {}
for n in alive:
    strategy = NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
    got = ray.get(seen.options(num_gpus=per_node, scheduling_strategy=strategy).remote(), timeout=120)
    workers[str(n["NodeManagerPort"])] = got
result = {"nodes": len(alive), "cluster_gpus": ray.cluster_resources().get("GPU"),
          "gpus": sorted(n["Resources"].get("GPU") for n in alive), "workers": workers,
          "args": sys.argv[1:]}
with open(os.environ["PROBE"], "w") as f:
    json.dump(result, f)
time.sleep(2)  # (the stand-in nvidia-smi's sweeps reach the record)
print("step:1 - x:1", flush=True)
print("step:2 - x:2", flush=True)
PY
"""

NODE_ARGS = "--num-cpus=1 --object-store-memory=80000000 --include-log-monitor=false"
HEAD_ARGS = "--include-dashboard=false"  # (Ray refuses it on a node that is not the head)


def processes_in(folder: Path) -> list[str]:
    """This user's processes whose working folder is inside `folder`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if proc.stat().st_uid == os.getuid() and state not in ("Z", "X"):
                if Path(os.readlink(proc / "cwd")).is_relative_to(folder):
                    found.append(f"{proc.name} {(proc / 'cmdline').read_bytes()[:200]!r}")
        except OSError:
            continue
    return found


def have_ray() -> bool:
    r = subprocess.run([sys.executable, "-c", "import ray"], capture_output=True)
    return r.returncode == 0 and (BIN / "ray").exists()


@pytest.mark.exclusive
@pytest.mark.skipif(not have_ray(), reason="ray is not installed in the test's venv")
def test_the_harness_forms_a_two_node_cluster_of_eight_gpus_and_tears_it_down(multi):
    g = bench_module("gpu_ppo")
    port = g.free_port_block(1, start=30000)  # the head's GCS port, in the launcher's own words
    code, text, _ = multi.cli(
        "launch",
        "ray",
        "h100",
        "--nodes",
        "2",
        "--gpus-per-node",
        "4",
        "--head-ip",
        "127.0.0.1",
        "--port",
        port,
    )
    assert code == 0
    launcher = multi.tmp / "launcher-port.txt"
    launcher.write_text(text)
    render = multi.tmp / "stand-in"
    shutil.copytree(multi.render, render)
    (render / "run_ppo_gsm8k.sh").write_text(TRAINER)
    probe = multi.tmp / "probe.json"
    env = dict(RAY_SHARED_HOST, PROBE=str(probe), HOME=str(multi.tmp))
    args = [
        "--nodes",
        "2",
        "--n-gpus",
        "4",
        f"--ray-node-args={NODE_ARGS}",  # (NAME=VALUE: argparse takes a lone --word for an option)
        f"--ray-head-args={HEAD_ARGS}",
        "--ray-wait",
        "180",
        "--timeout",
        "420",
    ]
    rc, rec, out, err = multi(*args, launcher_file=launcher, render_dir=render, env=env, timeout=600)
    if rec and rec.get("layout"):  # (Ray's temp dirs hold its logs; the test leaves none in /tmp)
        request_cleanup = rec["layout"]["temp_root"]
        multi.cleanup.append(request_cleanup)
    logs = json.dumps(rec.get("ray_node_logs"), indent=1) if rec else ""
    assert rc == 0 and rec["status"] == "ok", out[-3000:] + err[-3000:] + logs
    assert rec["ray_cluster"]["seen"]["nodes"] == 2 and rec["ray_cluster"]["seen"]["gpus"] == 8
    got = json.loads(probe.read_text())
    assert got["nodes"] == 2 and got["cluster_gpus"] == 8.0 and got["gpus"] == [4.0, 4.0]
    assert got["args"] == ["trainer.total_training_steps=2", "trainer.val_before_train=True"]
    seen = sorted(got["workers"].values(), key=lambda w: sorted(w["CUDA_VISIBLE_DEVICES"].split(",")))
    # each node's task holds that node's group (Ray hands the ids out in its own order)
    assert [sorted(w["CUDA_VISIBLE_DEVICES"].split(",")) for w in seen] == [list("0123"), list("4567")]
    for w in seen:  # what the launcher and the harness exported reaches each node's Ray workers
        assert w["NCCL_NVLS_ENABLE"] == "0" and w["NCCL_IB_DISABLE"] == "1"
        assert w["ENVBUILD_GPU_PPO_MARK"] == rec["layout"]["marker"]
    log = (multi.tmp / "out" / "multi.log").read_text()
    assert f"N_GPUS=4 NNODES=2 RAY_ADDRESS=127.0.0.1:{port}" in log  # the script ran on the head's Ray
    assert {"1", "2"} <= set(rec["steps"])
    # the teardown found the nodes' processes (by their marker and their sessions) and left none;
    # nor is any process left working in the run's folder (Ray's agents overwrite their environ)
    lay = rec["layout"]
    assert len(lay["sessions"]) == 3  # (the two nodes' `ray start`, the waiter)
    assert rec["ray_teardown"]["found"] >= 2 and rec["ray_teardown"]["left"] == []
    assert g.marked_pids(lay["marker"], lay["sessions"]) == []
    assert processes_in(multi.tmp) == []
    # each GPU's own series from the stand-in nvidia-smi (GPU i: (i + 1) x 1000 MiB), and their sum
    per = rec["smi"]["per_gpu"]
    assert sorted(per, key=int) == [str(i) for i in range(8)]
    assert {i: per[str(i)]["peak_mib"] for i in range(8)} == {i: (i + 1) * 1000 for i in range(8)}
    assert rec["smi"]["peak_mib"] == 36000
    assert per["7"]["of_plan"] == round(8000 / (rec["plan"]["peak_gib"] * 1024), 3)


# -- the device records' replay ---------------------------------------------------------------------

# Records of multi-GPU device runs (docs/multi-gpu.md): kept apart from tests/fixtures/gpu/ppo/,
# whose replay resolves every record at one GPU.
MULTI_RECORDS = sorted((ROOT / "tests" / "fixtures" / "gpu" / "multi").glob("*.json"))
# a multi-GPU run keeps the render's own batch: it changes only its length
MAY_CHANGE = {"trainer.total_training_steps", "trainer.val_before_train"}
HEADROOM = 1.1  # issue 49: every GPU within the plan's per-GPU peak + 10 %


def record_problems(r: dict) -> list[str]:
    """What keeps a multi-GPU record from counting against today's render (empty: it counts):
    a first validation and two steps with rc 0; nothing of the render changed but the run's
    length, and the render today's for its world; the pins today's; on every GPU of the run, a
    peak within the plan's per-GPU peak + 10 %; with several nodes, each started with today's
    launcher words, multicast off, the whole world joined and nothing left after the teardown."""
    from envbuilder.engines import launch as L

    out = []
    if (r.get("rc"), r.get("status")) != (0, "ok"):
        out.append(f"status {r.get('status')}, rc {r.get('rc')}")
    if not {"0", "1", "2"} <= set(r.get("steps") or {}):
        out.append("no first validation and two steps")
    # (on H200s lent for H100s, --card-gib 80 scales vLLM's share to an H100's bytes)
    may = MAY_CHANGE | ({"actor_rollout_ref.rollout.gpu_memory_utilization"} if r.get("card_gib") else set())
    if sorted(set(r.get("overrides_changed") or {}) - may):
        out.append(f"changed the render's {sorted(set(r['overrides_changed']) - may)}")
    world = r["plan"]["cluster"]
    env = resolved(
        r["profile"],
        model=r["model"],
        nodes=world["nodes"],
        gpus_per_node=world["gpus_per_node"],
        algo=r["algorithm"],
    )
    if r.get("render_overrides") != {a.key.lstrip("+"): str(a.value) for a in env.run}:
        out.append("the render it ran is not today's")
    if (r.get("nodes"), r.get("n_gpus")) != (world["nodes"], world["gpus_per_node"]):
        out.append(
            f"ran {r.get('nodes')} x {r.get('n_gpus')}, the render is {world['nodes']} x {world['gpus_per_node']}"
        )
    pins = {
        "verl": env.verl.version,
        "vllm": env.vllm.version if env.vllm else None,
        "torch": env.torch.version,
    }
    if {k: (r.get("versions") or {}).get(k) for k in pins} != pins:
        out.append(f"versions {r.get('versions')}, today's pins {pins}")
    limit = HEADROOM * env.memory.peak.gib * 1024
    lay = r.get("layout")
    used = [g for node in lay["node_list"] for g in node["gpus"]] if lay else list(range(r["n_gpus"]))
    per = r["smi"].get("per_gpu") or {}
    for g in used:
        one = per.get(str(g))
        if not one or one.get("peak_mib") is None:
            out.append(f"GPU {g}: no nvidia-smi samples")
        elif one["peak_mib"] > limit:
            out.append(f"GPU {g}: {one['peak_mib']} MiB, over the plan's {env.memory.peak.gib} GiB + 10 %")
    if lay:
        head, worker = launcher_lines(L.ray_commands(env, head_ip="127.0.0.1", port=lay["head_port"]))
        for node in lay["node_list"]:
            if node["launcher_words"] != (head if node["role"] == "head" else worker):
                out.append(f"node {node['node']} was not started with today's launcher words")
            if node["env"].get("NCCL_NVLS_ENABLE") != "0":
                out.append(f"node {node['node']}: NVLink multicast not off")
        seen = (r.get("ray_cluster") or {}).get("seen") or {}
        if (seen.get("nodes"), seen.get("gpus")) != (world["nodes"], world["nodes"] * world["gpus_per_node"]):
            out.append(f"Ray saw {seen}")
        if (r.get("ray_teardown") or {}).get("left") != []:
            out.append(f"left after the teardown: {(r.get('ray_teardown') or {}).get('left')}")
    return out


@pytest.mark.parametrize("path", MULTI_RECORDS, ids=lambda p: p.stem)
def test_a_multi_gpu_record_ran_todays_render_within_the_plan_on_every_gpu(path):
    assert record_problems(json.loads(path.read_text(encoding="utf-8"))) == []


def test_the_replay_takes_a_good_record_and_names_what_is_wrong_with_a_bad_one(multi):
    """A record made from the dry run of the real render, as a passing device run would fill it,
    counts; each fault is named."""
    rc, rec, _, err = multi("--dry-run", "--nodes", "2", "--n-gpus", "4")
    assert rc == 0, err
    env = resolved("h100", model=MODEL, nodes=2, gpus_per_node=4, algo="gae")
    plan_mib = env.memory.peak.gib * 1024
    rec.update(
        rc=0,
        status="ok",
        steps={"0": {}, "1": {}, "2": {}},
        versions={"verl": env.verl.version, "vllm": env.vllm.version, "torch": env.torch.version},
        ray_cluster={"seen": {"nodes": 2, "gpus": 8}},
        ray_teardown={"found": 40, "left": []},
    )
    rec["smi"] = {"per_gpu": {str(g): {"peak_mib": int(plan_mib * 1.05)} for g in range(8)}}
    assert record_problems(rec) == []

    def broken(change) -> list[str]:
        bad = json.loads(json.dumps(rec))
        change(bad)
        return record_problems(bad)

    assert broken(lambda b: b["smi"]["per_gpu"]["5"].update(peak_mib=int(plan_mib * 1.15))) == [
        f"GPU 5: {int(plan_mib * 1.15)} MiB, over the plan's {env.memory.peak.gib} GiB + 10 %"
    ]
    assert broken(lambda b: b["smi"]["per_gpu"].pop("7")) == ["GPU 7: no nvidia-smi samples"]
    assert broken(lambda b: b["overrides_changed"].update({"data.train_batch_size": {}})) == [
        "changed the render's ['data.train_batch_size']"
    ]
    assert broken(lambda b: b["render_overrides"].update({"data.train_batch_size": "512"})) == [
        "the render it ran is not today's"
    ]
    assert broken(lambda b: b["layout"]["node_list"][1]["launcher_words"].append("--num-cpus=8")) == [
        "node 1 was not started with today's launcher words"
    ]
    assert broken(lambda b: b["layout"]["node_list"][0]["env"].pop("NCCL_NVLS_ENABLE")) == [
        "node 0: NVLink multicast not off"
    ]
    assert broken(lambda b: b["ray_teardown"].update(left=[4242])) == ["left after the teardown: [4242]"]
    assert broken(lambda b: b["steps"].pop("2")) == ["no first validation and two steps"]


# -- the run book (docs/multi-gpu.md), rehearsed --------------------------------------------------

RUN_BOOK = ROOT / "docs" / "multi-gpu.md"


def run_book_calls(prog: str) -> list[list[str]]:
    """The words of every `envbuild ...` or `python3 bench/gpu_ppo.py ...` call in the run book's
    bash blocks (a `> FILE` redirection kept as its last two words)."""
    calls, inside = [], False
    for line in RUN_BOOK.read_text().splitlines():
        if line.strip().startswith("```"):
            inside = line.strip() == "```bash"
            continue
        words = shlex.split(line, comments=True) if inside else []
        if prog == "envbuild" and words[:1] == ["envbuild"]:
            calls.append(words[1:])
        elif prog == "gpu_ppo" and words[:2] in (
            ["python3", "bench/gpu_ppo.py"],
            ["python", "bench/gpu_ppo.py"],
        ):
            calls.append(words[2:])
    return calls


def test_the_run_books_lines_render_and_dry_run_here(tmp_path, cli):
    """Every render and launcher of docs/multi-gpu.md, as written (in a folder of the test's),
    and then every `gpu_ppo.py run` line of it as a dry run against them, with a stand-in
    nvidia-smi listing the GPUs its line asks for; the TP case's plan splits its rollout."""
    envbuild = run_book_calls("envbuild")
    renders = [w for w in envbuild if w[0] == "render"]
    launchers = [w for w in envbuild if w[:2] == ["launch", "ray"]]
    assert len(renders) == 9 and len(launchers) == 3, envbuild
    for words in renders:
        code, _, err = cli(*words)  # (-o .gpu/cases/...: cli's folder is the test's own)
        assert code == 0, (words, err)
    for words in launchers:
        words, (redirect, path) = words[:-2], words[-2:]
        assert redirect == ">"
        code, text, err = cli(*words)
        assert code == 0, (words, err)
        (tmp_path / path).write_text(text)
    cases = tmp_path / ".gpu" / "cases"
    tp = json.loads((cases / "h100-14b-gae-8" / "h100" / "envbuild.json").read_text())["memory"]["rollout_tp"]
    assert tp > 1
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(NVIDIA_SMI)
    (fake / "nvidia-smi").chmod(0o755)
    runs = [w for w in run_book_calls("gpu_ppo") if w[0] == "run"]
    assert len(runs) == 9, runs
    for words in runs:
        flags = dict(zip(words[1::2], words[2::2]))  # (every flag of these lines takes a value)
        gpus = int(flags.get("--nodes", "1")) * int(flags["--n-gpus"])
        words = [w.replace("$OUT", str(tmp_path / "out")) for w in words]
        words += ["--dry-run", "--no-prepare", "--work", str(tmp_path / "w" / flags["--case"])]
        env = dict(os.environ, PATH=f"{fake}:{BIN}:/usr/bin:/bin", FAKE_GPUS=str(gpus))
        r = subprocess.run(
            [sys.executable, str(GPU_PPO), *words],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, (words, r.stderr[-2000:])
        rec = json.loads((tmp_path / "out" / f"{flags['--case']}.json").read_text())
        assert rec["status"] == "dry-run" and rec["n_gpus"] == int(flags["--n-gpus"])
        world = rec["plan"]["cluster"]
        assert (world["nodes"], world["gpus_per_node"]) == (rec["nodes"], rec["n_gpus"]), flags["--case"]
        if rec["nodes"] > 1:
            groups = [n["gpus"] for n in rec["layout"]["node_list"]]
            assert sorted(g for group in groups for g in group) == list(range(gpus))
