"""One declaration of the override flags (envbuilder/model/flags.py): every command a rendered
README, `launch` or a fix prints with them parses back, through the real command line, to the
same Overrides (issue 34 #4: the README said `--gpus_per_node 2`, which does not parse)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from envbuilder.model import flags as F
from envbuilder.model.resolved import Overrides
from envbuilder.render.context import BuildContext

# a value of every override, as a user would give it
VALUES = {
    "cuda": "12.4",
    "torch": "2.6.0",
    "python": "3.10",
    "verl": "0.4.1",
    "rollout": "hf",
    "vllm": "0.8.5",
    "with_": ("apex",),
    "without": ("flash-attn",),
    "driver": "550.54.14",
    "allow_unsupported": True,
    "model": "Qwen/Qwen2.5-0.5B-Instruct",
    "algo": "grpo",
    "nodes": 2,
    "gpus_per_node": 4,
    "interconnect": "ib",
    "rollout_tp": 2,
    "offload": ("params", "optimizer"),
    "sp": 2,
    "host_memory": 512,
    "lora_rank": 32,
    "max_prompt_length": 2048,
    "max_response_length": 8192,
    "ecc": "off",
    "gpu_memory": 40960,
    "flash_attn_index": "https://verl-project.github.io/verl-wheelhouse/cu130/torch2.11/simple/",
    "engine": "megatron",
    "megatron": ("tp=2", "ep=8"),
}


def test_the_declaration_covers_every_override_once():
    derived = set(Overrides._derived)
    assert sorted(f.field for f in F.FLAGS) == sorted(k for k in Overrides._fields if k not in derived)
    assert set(VALUES) == {f.field for f in F.FLAGS}
    assert len({f.flag for f in F.FLAGS}) == len(F.FLAGS)


def test_the_click_options_are_the_declaration():
    from envbuilder.cli.check import check

    params = {p.name: p for p in check.params}
    for f in F.FLAGS:
        assert params[f.param].opts == [f.flag], f.flag
        assert params[f.param].help == f.help


@pytest.fixture
def parse(monkeypatch):
    """argv -> the Overrides the real command line makes of it (resolve is stopped there)."""
    from envbuilder.cli.app import main
    from envbuilder.errors import UserError
    from envbuilder.model import resolve as R

    seen: list[Overrides] = []

    def caught(m, profile, overrides=None, *a, **kw):
        seen.append(overrides)
        raise UserError("stopped by the test")

    real = R.resolve
    monkeypatch.setattr(R, "resolve", caught)

    def run(argv: list[str]) -> Overrides:
        seen.clear()
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and len(seen) == 1, argv
        return seen[0]

    run.real = real  # type: ignore[attr-defined]
    return run


def _one(field):
    value = VALUES[field]
    return Overrides(**{field: value})


@pytest.mark.parametrize("field", list(VALUES))
def test_readme_flags_of_each_override_parse_back(parse, field):
    from envbuilder.render.plan import override_flags

    ov = _one(field)
    argv = shlex.split(f"render p40{override_flags(ov)}")
    assert parse(argv) == ov
    if F.BY_FIELD[field].kind == F.NAMES:  # a list of two, comma-joined
        two = Overrides(**{field: ("apex", "flash-attn")})
        assert parse(shlex.split(f"render p40{override_flags(two)}")) == two


def test_every_override_at_once_parses_back(parse):
    from envbuilder.engines.launch import build_command
    from envbuilder.render.plan import override_flags

    ov = Overrides(**VALUES)
    assert parse(shlex.split(f"render p40{override_flags(ov)}")) == ov

    class Env:  # what build_command reads of a resolved environment
        profile = asked = "p40"  # (asked: what the user named, the card or the profile)
        overrides = ov

        class cluster:
            nodes = 3
            gpus_per_node = 8

    words = shlex.split(build_command(Env))
    assert words[:3] == ["envbuild", "build", "p40"]
    assert parse(words[1:]) == ov._replace(nodes=3, gpus_per_node=8)


def test_a_rendered_readme_and_launch_lines_parse_back(parse):
    """The real files: a render's README ("Written by `envbuild render ...`") and `launch
    slurm`'s `envbuild build` line, each parsed back to the Overrides they were made with."""
    from envbuilder.engines import launch
    from envbuilder.model import matrix
    from envbuilder.model.profiles import overrides_from_flags
    from envbuilder.render.files import render_files

    m = matrix.load(())
    given = {"algo": "grpo", "gpus_per_node": 2, "nodes": 2, "interconnect": "ib", "ecc": "off"}
    ov = overrides_from_flags({F.BY_FIELD[k].param: v for k, v in given.items()}, lambda: m)
    env = parse.real(m, "4090", ov)
    readme = render_files(BuildContext.of(env))["README.md"]
    written = re.search(r"Written by `envbuild (render [^`]*)`", readme)
    assert written, readme[:600]
    assert parse(shlex.split(written.group(1))) == ov
    line = launch.build_command(env)
    assert parse(shlex.split(line)[1:]) == ov._replace(nodes=2, gpus_per_node=2)


def test_fix_flags_are_declared_flags():
    """A fix offers only flags the declaration has, and `applied` sets the declared field."""
    from envbuilder.model.fixes import FIX_FLAG, applied

    for f in F.FLAGS:
        if f.fix:
            value = F.words(Overrides(**{f.field: VALUES[f.field]}))[1]
            text = f"use {f.flag} {value}"
            flag, got = FIX_FLAG.search(text).groups()
            assert applied(Overrides(), {flag: got}) == Overrides(**{f.field: VALUES[f.field]})


# the options of other commands (and other tools) that the resolver's and detect's messages name
OTHER_OPTIONS = {
    "--matrix-dir", "--mirror", "--query-gpu", "--memory", "--from", "--format", "--builder",
    "--no-deps", "--all", "--runtime", "--ppo", "--json", "--gpus", "--flag", "--registry", "--resolve",
    "--gpu",  # (grid's own: `envbuild grid --gpu p100`, names.py's hint for a card with no profile)
}  # fmt: skip


def test_hints_spell_only_declared_flags():
    """Every `--flag` the resolver's, the fixes' and detect's messages spell is a declared
    override flag (so renaming one fails here until its hints follow) or another command's own
    option, never a field name (`--gpus_per_node`)."""
    files = [*Path("envbuilder/model").glob("*.py"), Path("envbuilder/machine/detect.py")]
    files.append(Path("envbuilder/machine/doctor.py"))
    spelled = {f for p in files for f in re.findall(r"--[a-z][a-z_-]*[a-z]", p.read_text())}
    assert spelled - OTHER_OPTIONS <= set(F.BY_FLAG), sorted(spelled - OTHER_OPTIONS - set(F.BY_FLAG))
    assert set(F.BY_FLAG) <= spelled | {"--nodes"}


def test_a_model_folder_parses_back(parse, tmp_path):
    """--model FOLDER: the README names the folder as an absolute path, which parses back to
    the same model (read again from its config.json)."""
    from envbuilder.render.plan import override_flags

    folder = tmp_path / "my-model.v2"
    folder.mkdir()
    src = Path(__file__).parent / "fixtures" / "hf" / "Qwen" / "Qwen3-8B" / "config.json"
    (folder / "config.json").write_bytes(src.read_bytes())
    first = parse(["render", "p40", "--model", str(folder)])
    assert first.model == str(folder.resolve())
    assert parse(shlex.split(f"render p40{override_flags(first)}")) == first
