"""The memory estimate and the batch sizes it plans: the model table is checked against itself,
every generation and micro-batch of the run script is bounded and fits, a profile that cannot fit
is refused with the fix, and every key the run script sets exists in that verl release's config."""

from __future__ import annotations

import shlex

import json
import math

import pytest
import yaml

from conftest import FIXTURES, PROFILES, record, resolved, shipped, violations
from envbuilder.model import matrix as M
from envbuilder.model import memory
from envbuilder.errors import UserError
from envbuilder.render.files import RUN_SCRIPT, render_files
from envbuilder.render.context import BuildContext

CONFIGS = FIXTURES / "verl-configs"
CONFIG_FILE = {
    "0.4.1": CONFIGS / "0.4.1" / "ppo_trainer.yaml",
    **{v: CONFIGS / v / "_generated_ppo_trainer.yaml" for v in ("0.6.1", "0.7.1", "0.8.0", "0.9.0", "0.9.1")},
}


def plan_of(profile: str, matrix=None) -> dict:
    return resolved(profile, matrix).to_dict()["memory"]


def setup_of(profile: str, matrix=None, **train):
    m = matrix or shipped()
    env = resolved(profile, m).to_dict()
    env = dict(env, train=dict(env["train"], **train))
    total = m.memory["total_mib"].get(env["gpu"]["key"])
    consts = dict(m.memory, total_gib=total["mib"] / 1024 if total else float(env["gpu"]["vram_gb"]))
    return memory.setup(env, m.models[env["train"]["model"]], consts, m.datasets["gsm8k"]["rows"]["test"])


URL = "https://example.org/my-lab-notes"  # an overlay fact's source may be a URL


def rec(section: str, key: str, **changes) -> dict:
    """A shipped record for an overlay (its source a URL: the overlay has no `sources:`)."""
    return record(section, key, source=URL, **changes)


def load_error(folder) -> str:
    with pytest.raises(UserError) as e:
        M.load((folder,))
    return str(e.value)


# -- the model table ---------------------------------------------------------------------------


def test_the_model_card_parameter_counts_follow_from_the_architecture():
    m = shipped()
    counts = {name: memory.Arch(name, rec).params() for name, rec in m.models.items()}
    assert counts["Qwen/Qwen2.5-0.5B-Instruct"] == 494_032_768
    assert counts["Qwen/Qwen2.5-1.5B-Instruct"] == 1_543_714_304
    assert counts["Qwen/Qwen2.5-7B-Instruct"] == 7_615_616_512
    arch = memory.Arch("7B", m.models["Qwen/Qwen2.5-7B-Instruct"])
    # the critic drops the untied lm_head and adds a (hidden -> 1) score head
    assert arch.critic_params() == 7_615_616_512 - 152064 * 3584 + 3584 + 1


def test_every_profiles_model_is_in_the_table():
    m = shipped()
    assert {p["train"]["model"] for p in m.profiles.values()} <= set(m.models)


def test_a_mistyped_architecture_field_is_caught_by_the_parameter_count(overlay):
    model = rec("models", "Qwen/Qwen2.5-0.5B-Instruct", intermediate_size=4846)
    msg = load_error(overlay({"models": {"Qwen/Qwen2.5-0.5B-Instruct": model}}))
    assert "models.Qwen/Qwen2.5-0.5B-Instruct.parameters is 494,032,768" in msg
    assert "config.json" in msg


def test_a_profile_whose_model_is_not_in_the_table_is_refused_with_the_fix(overlay):
    prof = rec("profiles", "p40")
    prof["train"]["model"] = "Qwen/Qwen2.5-0.5B-Instruc"
    msg = load_error(overlay({"profiles": {"mine": prof}}))
    assert "not in the model table" in msg and "Did you mean 'Qwen/Qwen2.5-0.5B-Instruct'" in msg
    assert "--matrix-dir" in msg


@pytest.mark.parametrize(
    "change, says",
    [
        ({"n_gpus": 0}, "n_gpus must be at least 1"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization must be in (0, 1]"),
        ({"train_batch_size": 12, "n_gpus": 8}, "must be multiples of n_gpus"),
        ({"ppo_mini_batch_size": 64}, "larger than train_batch_size"),
        ({"max_response_length": 40000}, "exceeds Qwen/Qwen2.5-0.5B-Instruct's max_position_embeddings"),
    ],
)
def test_a_train_block_that_cannot_be_sized_is_refused_at_load(overlay, change, says):
    prof = rec("profiles", "p40")
    prof["train"].update(change)
    msg = load_error(overlay({"profiles": {"mine": prof}}))
    assert says in msg and "profiles.mine.train" in msg


# -- the plan ----------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", PROFILES)
def test_every_planned_phase_fits_its_budget_with_the_margin(profile):
    mem = plan_of(profile)
    assert not mem["problems"]
    for phase in mem["phases"]:
        overhead = 1 + mem["allocator_overhead"]
        exempt = sum(t["bytes"] for t in phase["terms"] if t["term"] == "vLLM share")
        used = (phase["bytes"] - exempt) * overhead + exempt
        budget = phase["budget_gib"] * memory.GIB
        if phase["key"] in ("generation", "log_prob", "actor", "critic"):
            budget *= 1 - mem["margin"]
        assert used <= budget, phase["phase"]


@pytest.mark.parametrize("profile", PROFILES)
def test_every_generation_batch_is_bounded_and_splits_as_verl_splits_it(profile):
    mem, env = plan_of(profile), resolved(profile).to_dict()
    b, n = mem["batch"], env["train"]["n_gpus"]
    per_gpu = b["val_batch_size"] // n
    assert b["val_batch_size"] % n == 0 and per_gpu <= math.ceil(mem["validation_rows"] / n)
    if env["rollout"] == "hf":
        # HFRollout splits batch // micro_batch_size chunks that DataProto.chunk wants equal
        rollout = mem["rollout_batch_per_gpu"]
        micro = b["rollout_micro_batch_size"]
        assert micro == per_gpu and b["max_num_seqs"] is None
        chunks = max(rollout // micro, 1)
        assert rollout % chunks == 0 and rollout // chunks <= micro
        for val_batch in (per_gpu, mem["validation_rows"] % per_gpu or per_gpu):
            assert max(val_batch // micro, 1) == 1
    else:
        assert b["max_num_seqs"] == per_gpu and b["rollout_micro_batch_size"] is None


@pytest.mark.parametrize("profile", PROFILES)
def test_every_micro_batch_divides_the_mini_batch_and_is_the_largest_that_fits(profile):
    s = setup_of(profile)
    mem = plan_of(profile)
    for key, name in (
        ("actor", "actor_ppo_micro_batch_size_per_gpu"),
        ("critic", "critic_ppo_micro_batch_size_per_gpu"),
        ("log_prob", "log_prob_micro_batch_size_per_gpu"),
        ("generation", "rollout_micro_batch_size" if s.rollout == "hf" else "max_num_seqs"),
    ):
        chosen = mem["batch"][name]
        cands = memory.candidates(s, key)
        assert chosen in cands
        bigger = [c for c in cands if c > chosen]
        if key in ("actor", "critic"):
            assert mem["mini_batch_per_gpu"] % chosen == 0
        budget = memory.estimate(s, key, 1)["budget_gib"]
        assert memory.fits(s, memory.estimate(s, key, chosen)["bytes"], budget, key=key)
        if bigger:  # the next size up would not fit: the plan is as large as memory allows
            assert mem["bound_by"][key] == "memory"
            assert not memory.fits(s, memory.estimate(s, key, bigger[0])["bytes"], budget, key=key)


def test_the_p40_validates_in_batches_because_the_whole_set_does_not_fit():
    """The field report's crash at the first validation: verl 0.4.1 generates all 1,319 GSM8K
    test prompts as one batch unless data.val_batch_size is set."""
    s, mem = setup_of("p40"), plan_of("p40")
    whole = memory.estimate(s, "generation", mem["validation_rows"])
    assert not memory.fits(s, whole["bytes"], mem["usable_gib"], margin=False)
    assert mem["batch"]["val_batch_size"] < mem["validation_rows"]
    assert mem["bound_by"]["generation"] == "memory"
    assert [t["term"] for t in whole["terms"] if t["kind"] == "work"][:2] == [
        "KV cache (prompt)",
        "prefill transient",
    ]


def test_a_huge_batch_is_planned_without_enumerating_it(overlay):
    prof = rec("profiles", "3090")
    prof["train"].update(train_batch_size=2**40, ppo_mini_batch_size=2**39)
    m = M.load((overlay({"profiles": {"mine": prof}}),))
    # (GSM8K's 7,473 rows refuse such a batch at resolve time: the plan alone is sized here)
    mem = memory.plan(
        {
            "dtype": "bf16",
            "attention": "sdpa",
            "rollout": "vllm",
            "train": prof["train"],
            "engine_batches": True,
        },
        m.models[prof["train"]["model"]],
        dict(m.memory, total_gib=24.0),
        m.datasets["gsm8k"]["rows"]["test"],
    )
    assert 1 <= mem["batch"]["log_prob_micro_batch_size_per_gpu"] < 64
    assert mem["bound_by"]["actor"] == "memory"


def test_more_memory_never_plans_smaller_batches(overlay):
    gpu = rec("gpus", "p40", vram_gb=48)
    card = "https://example.org/a-48gb-card"  # (the card's size is memory.yaml's, not vram_gb)
    mem = dict(shipped().memory, total_mib={"p40": {"mib": 48 * 1024, "source": card}}, source=card)
    bigger = plan_of("p40", M.load((overlay({"gpus": {"p40": gpu}, "memory": mem}),)))["batch"]
    smaller = plan_of("p40")["batch"]
    assert all(bigger[k] >= smaller[k] for k in smaller if smaller[k] is not None)
    assert bigger["val_batch_size"] > smaller["val_batch_size"]


def test_offload_takes_the_idle_roles_state_off_the_gpu():
    on = {t["term"] for p in plan_of("3090")["phases"] if p["key"] == "actor" for t in p["terms"]}
    off = {t["term"] for p in plan_of("t4")["phases"] if p["key"] == "actor" for t in p["terms"]}
    assert {"critic weights (resident)", "critic Adam state (resident)"} <= on
    assert not any("resident" in t for t in off)
    # the role's own phase loads its state back: offload never shrinks its own update
    assert {"actor weights", "actor gradients", "actor Adam state"} <= off


def test_a_profile_capped_micro_batch_is_respected(overlay):
    prof = rec("profiles", "3090")
    prof["train"]["micro_batch_size_per_gpu"] = 2
    mem = plan_of("mine", M.load((overlay({"profiles": {"mine": prof}}),)))
    assert mem["batch"]["actor_ppo_micro_batch_size_per_gpu"] <= 2
    assert mem["batch"]["log_prob_micro_batch_size_per_gpu"] <= 2
    assert mem["bound_by"]["actor"] == "profile cap"


# -- refusing what cannot fit ------------------------------------------------------------------


def test_the_seed_4090_model_is_refused_with_a_smaller_model_from_the_table(overlay):
    prof = rec("profiles", "4090")
    prof["train"]["model"] = "Qwen/Qwen2.5-1.5B-Instruct"
    m = M.load((overlay({"profiles": {"4090": prof}}),))
    v = violations("4090", m)["memory"]
    assert "Qwen/Qwen2.5-1.5B-Instruct does not fit the NVIDIA GeForce RTX 4090" in v.what
    assert "critic" in v.why and "GiB" in v.why
    assert "use --model Qwen/Qwen2.5-0.5B-Instruct" in v.fix  # (a flag: the fix walk checks it)
    # --allow-unsupported renders anyway, with the warning in the files
    env = resolved("4090", m, allow_unsupported=True)
    assert any("does not fit" in w for w in env.to_dict()["warnings"])


def test_a_vllm_share_too_large_for_the_rest_is_planned_down_to_what_they_leave(overlay):
    # the profile's figure is the most vLLM may take; the plan gives it what the resident roles
    # leave (a fixed 0.95 would leave the critic and actor no room while it generates)
    prof = rec("profiles", "3090")
    prof["train"]["gpu_memory_utilization"] = 0.95
    env = resolved("mine", M.load((overlay({"profiles": {"mine": prof}}),)))
    assert env.train.gpu_memory_utilization < 0.95
    outside = next(p for p in env.memory["phases"] if p["key"] == "generate_outside")
    assert outside["fits"]


def test_show_memory_prints_the_budget_and_a_refusal_is_exit_2(cli, overlay):
    code, out, _ = cli("show", "p40", "--memory")
    assert code == 0
    assert "22.4 GiB (22919 MiB: ECC on, the board's default" in out and "21.9 GiB usable" in out
    assert "eager scores" in out and "KV cache" in out
    assert "data.val_batch_size" in out and "+actor_rollout_ref.rollout.micro_batch_size" in out
    code, out, _ = cli("show", "p40", "--memory", "--json")
    assert code == 0 and json.loads(out)["memory"] == plan_of("p40")
    prof = rec("profiles", "4090")
    prof["train"]["model"] = "Qwen/Qwen2.5-7B-Instruct"
    code, _, err = cli("show", "4090", "--memory", "--matrix-dir", overlay({"profiles": {"4090": prof}}))
    assert code == 2 and "does not fit" in err and "Fix:" in err


# -- the run script ----------------------------------------------------------------------------


def _overrides(profile: str, **options) -> list[str]:
    script = render_files(BuildContext.of(resolved(profile, **options)))[RUN_SCRIPT]
    body = script.split("args=(", 1)[1].split("\n)", 1)[0]
    # one word a line, as bash reads it (quotes removed: 'trainer.logger=[console]')
    return [
        shlex.split(line)[0]
        for line in body.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


@pytest.mark.parametrize("profile", PROFILES)
def test_the_run_script_sets_every_planned_size(profile):
    b = plan_of(profile)["batch"]
    lines = _overrides(profile)
    # async releases (verl 0.7+) send validation to the rollout server whole and deprecate
    # data.val_batch_size: it is sized there by max_num_seqs, not set
    asynchronous = resolved(profile).verl.rollout_mode == "async"
    want = [
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={b['actor_ppo_micro_batch_size_per_gpu']}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={b['log_prob_micro_batch_size_per_gpu']}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={b['log_prob_micro_batch_size_per_gpu']}",
        f"critic.ppo_micro_batch_size_per_gpu={b['critic_ppo_micro_batch_size_per_gpu']}",
        f"trainer.test_freq={b['test_freq']}",
    ]
    want.append(
        f"+actor_rollout_ref.rollout.micro_batch_size={b['rollout_micro_batch_size']}"
        if b["rollout_micro_batch_size"]
        else f"actor_rollout_ref.rollout.max_num_seqs={b['max_num_seqs']}"
    )
    if asynchronous:
        assert not any(line.startswith("data.val_batch_size=") for line in lines)
    else:
        want.append(f"data.val_batch_size={b['val_batch_size']}")
    assert set(want) <= set(lines)


def _has(config: dict, key: str) -> bool:
    node = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


# every shipped profile as shipped, and every shipped stack (stacks.yaml) on a bf16 and an fp16 card
_RUNS = [(p, None) for p in PROFILES] + [(p, v) for v in shipped().stacks for p in ("h100", "t4")]


@pytest.mark.parametrize("profile,verl", _RUNS, ids=[f"{p}-{v or 'default'}" for p, v in _RUNS])
def test_every_key_the_run_script_sets_is_in_that_verl_releases_config(profile, verl):
    """Hydra refuses a plain key the config lacks and a `+key` it has: read against the release's
    own ppo_trainer config (tests/fixtures/verl-configs, from the PyPI wheels)."""
    options = {"verl": verl} if verl else {}
    version = resolved(profile, **options).to_dict()["verl"]["version"]
    config = yaml.safe_load(CONFIG_FILE[version].read_text(encoding="utf-8"))
    for line in _overrides(profile, **options):
        key = line.split("=", 1)[0]
        if key.startswith("++"):
            continue
        if key.startswith("+"):
            assert not _has(config, key[1:]), f"{key}: verl {version} has it; drop the +"
        else:
            assert _has(config, key), f"{key}: not in verl {version}'s config; it needs a +"


def test_a_p40_plans_with_ecc_on_unless_told_it_is_off():
    """A Tesla P40 ships with ECC on and shows 22,919 MiB; with ECC off (nvidia-smi -e 0) it shows
    24,451 MiB: --ecc off plans with that, and the batches grow with it."""
    on, off = resolved("p40").memory, resolved("p40", ecc="off").memory
    assert on["card"]["mib"] == 22919 and on["card"]["ecc"] == "on"
    assert off["card"]["mib"] == 24451 and off["card"]["ecc"] == "off"
    assert off["usable_gib"] > on["usable_gib"]
    assert off["batch"]["val_batch_size"] > on["batch"]["val_batch_size"]
    assert resolved("p40", ecc="on").memory == on


def test_ecc_off_changes_nothing_on_a_card_without_a_recorded_ecc_size():
    for profile in ("3090", "h100"):
        assert resolved(profile, ecc="off").memory["batch"] == resolved(profile).memory["batch"]
        assert "changes nothing" in resolved(profile, ecc="off").memory["card"]["why"] or (
            "no other size" in resolved(profile, ecc="off").memory["card"]["why"]
        )
