"""The resolver's selection in stages (envbuilder/model/stages.py, issue 46): each stage returns a
new frozen record, the Selection is their frozen composition, and no stage, rule or later
resolution changes a record made before it."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from conftest import overrides, shipped
from envbuilder.model import stages
from envbuilder.model.resolve import resolve
from envbuilder.model.rules import judge
from envbuilder.model.selection import Selection
from envbuilder.model.sizing import sizing
from envbuilder.record import Record, plain

STAGES = (
    "versions",
    "rollout_pick",
    "kernels",
    "pin_set",
    "engine_pick",
    "train_plan",
    "cluster",
    "memory_pick",
)

# the containers a stage makes (the matrix's own records a stage picks are the matrix's: held as
# they are, and nothing changes them): read-only mappings and tuples
MADE = {
    "versions": ("components",),
    "rollout_pick": ("extra_cudas", "usable_cudas"),
    "kernels": ("feats",),
    "pin_set": ("pins",),
    "train_plan": ("train", "notes", "refused"),
    "cluster": ("train", "notes", "pinned"),
    "memory_pick": ("train", "notes"),
}

# profiles and overrides whose stages change what an earlier one made: the HF rollout's LoRA and
# offload, rounded batches on a larger world, the user's world choices, the memory plan's choices,
# a multi-node NVLink GPU's NCCL settings, a Megatron layout given (the shipped matrix: the frozen
# fixture matrix has no interconnects)
CASES = [
    ("p40", {}),
    ("4090", {}),
    ("t4", {"nodes": 2}),
    ("a100", {"gpus_per_node": 4, "offload": ("params",)}),
    ("gb200", {"nodes": 2, "interconnect": "ib"}),
    ("h100", {"engine": "megatron", "megatron": ("tp=2", "pp=1")}),
]


def selection(profile: str, **kw) -> Selection:
    return stages.select(stages.ask(shipped(), profile, overrides(**kw)))


@pytest.mark.parametrize("profile,kw", CASES, ids=[p for p, _ in CASES])
def test_every_stage_record_is_frozen_and_so_is_what_it_made(profile, kw):
    s = selection(profile, **kw)
    with pytest.raises(AttributeError):
        s.versions = s.versions  # type: ignore[misc]
    for name in STAGES:
        rec = getattr(s, name)
        assert isinstance(rec, Record), name
        field = rec._fields[0]
        with pytest.raises(AttributeError):
            setattr(rec, field, getattr(rec, field))
        for made in MADE.get(name, ()):
            value = getattr(rec, made)
            assert isinstance(value, (tuple, MappingProxyType)), f"{name}.{made} is a {type(value).__name__}"
            if isinstance(value, MappingProxyType):
                with pytest.raises(TypeError):
                    value["planted"] = 1  # type: ignore[index]
    net = s.cluster.network
    assert isinstance(net.cluster_env, MappingProxyType) and isinstance(net.notes, tuple)
    assert s.megatron_layout is None or isinstance(s.megatron_layout, MappingProxyType)


@pytest.mark.parametrize("profile,kw", CASES, ids=[p for p, _ in CASES])
def test_rules_and_later_resolutions_leave_a_selection_as_it_was(profile, kw):
    """The same profile resolved again, every other case resolved, and the rules run over the
    selection: its records read the same, all the way down (the matrix's own records too)."""
    a = stages.ask(shipped(), profile, overrides(**kw))
    s = stages.select(a)
    before = plain(s)
    judge(a, s)
    assert stages.select(a) == s  # (the same inputs: the same records)
    for other, other_kw in CASES:
        stages.select(stages.ask(shipped(), other, overrides(**other_kw)))
        resolve(shipped(), other, overrides(allow_unsupported=True, **other_kw), check_fixes=False)
    assert plain(s) == before


def test_a_stage_returns_a_new_record_and_leaves_its_inputs_alone():
    """cluster_plan rounds the batches and takes --offload into its own train block; memory_pick
    takes the memory plan's choices into its own: the train plan's block stays the profile's."""
    a = stages.ask(shipped(), "a100", overrides(gpus_per_node=4, offload=("params",)))
    v = stages.versions(a)
    k, e, tp = stages.kernels(a, v), stages.engine_pick(a, v), stages.train_plan(a, v)
    tp_before = plain(tp)
    c = stages.cluster_plan(a, v, k, e, tp)
    assert plain(tp) == tp_before
    assert c.train is not tp.train and c.train["n_gpus"] == 4 != tp.train["n_gpus"]
    assert c.pinned == ("offload",) and c.train["param_offload"] and not tp.train["param_offload"]
    c_before = plain(c)
    mp = stages.memory_pick(a, sizing(v, k, e, tp, c), v, e, tp, c)
    assert plain(c) == c_before and plain(tp) == tp_before
    assert (
        mp.train is not c.train
        and mp.train["gpu_memory_utilization"] == mp.plan.choices.gpu_memory_utilization.value
    )
    # the composition reads the last stage's train block and every stage's notes, in order
    s = stages.select(a)
    assert s.train == mp.train
    assert s.notes == tp.notes + c.notes + c.network.notes + mp.notes


def test_the_rules_notes_are_the_findings_not_the_selections():
    """A rule's note (aarch64's, the components') goes into the findings; the selection's notes
    stay the stages'. The rendered notes are both, the selection's first."""
    a = stages.ask(shipped(), "gb200", overrides(nodes=2))
    s = stages.select(a)
    notes = s.notes
    found = judge(a, s)
    assert notes and found.notes and s.notes == notes
    env = resolve(shipped(), "gb200", overrides(nodes=2))
    assert env.notes == (*notes, *found.notes)
