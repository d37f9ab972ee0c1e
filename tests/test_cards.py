"""Every common card by its own name (issue 45 item 3, issue 44 Medium 7 and its Low item on
titles): a memory record and an identity for each, and a card without a profile of its own
keeps its name where it borrows another profile's stack: the plan, the title, the folder, the
grid, check and detect."""

from __future__ import annotations

import json

import pytest

from conftest import shipped
from envbuilder.errors import UserError
from envbuilder.model.names import match_gpu, profile_named
from envbuilder.model.resolve import ResolveError, resolve
from envbuilder.render.context import BuildContext

# what people type for the cards of the issues -> the matrix's card it names
CARDS = {
    "L4": "l4",
    "NVIDIA L40S": "l40s",
    "NVIDIA L40": "l40",
    "NVIDIA L20": "l20",
    "NVIDIA A10": "a10",
    "NVIDIA A10G": "a10g",
    "NVIDIA A40": "a40",
    "NVIDIA RTX A6000": "rtx-a6000",
    "NVIDIA RTX 6000 Ada Generation": "rtx-6000-ada",
    "NVIDIA GeForce RTX 3080": "3080",
    "NVIDIA GeForce RTX 3090 Ti": "3090-ti",
    "NVIDIA GeForce RTX 4080": "4080",
    "NVIDIA GeForce RTX 5080": "5080",
    "NVIDIA A800-SXM4-80GB": "a800",
    "NVIDIA A800 80GB PCIe": "a800-pcie",
    "NVIDIA H800": "h800",
    "NVIDIA H20": "h20",
    "NVIDIA H100 NVL": "h100-nvl",
    "NVIDIA H100 PCIe": "h100-pcie",
    "Tesla V100-PCIE-16GB": "v100-16gb-pcie",
    "Tesla V100-PCIE-32GB": "v100-pcie",
    "Tesla V100S-PCIE-32GB": "v100-pcie",
    "NVIDIA A100-SXM4-40GB": "a100-40gb",
    "NVIDIA A100-PCIE-40GB": "a100-40gb-pcie",
    "Tesla P100-PCIE-16GB": "p100",
}


@pytest.mark.parametrize("typed, card", CARDS.items())
def test_each_common_card_is_a_card_of_its_own(typed, card):
    assert match_gpu(shipped(), typed) == card


@pytest.mark.parametrize("card", list(shipped().gpus))
def test_every_card_has_a_sourced_memory_record_and_an_identity(card):
    m = shipped()
    rec = m.memory["total_mib"].get(card)
    assert rec is not None and rec["source"], f"{card}: no nvidia-smi size recorded"
    gpu = m.gpus[card]
    assert gpu.get("form_factor") and gpu.get("interconnect") in m.sections["interconnects"]
    assert m.sections["interconnects"][gpu["interconnect"]]["scope"] == "node"


def test_a_pcie_board_is_a_card_whose_identity_says_pcie():
    """A board nvidia-smi names PCIe (tests/fixtures/gpu/skus.csv) is not taken for its SXM
    sibling: its own card, built as a PCIe card, its GPUs talking over PCIe."""
    from test_card_sizes import SKUS

    m = shipped()
    names = [line.split(",")[1].strip() for line in SKUS.read_text().splitlines() if not line.startswith("#")]
    pcie = [n for n in names if "pcie" in n.casefold()]
    assert len(pcie) >= 5, pcie
    for name in pcie:
        gpu = m.gpus[match_gpu(m, name)]
        assert (gpu["form_factor"], gpu["interconnect"]) == ("pcie", "pcie"), name


def test_a_gpu_key_names_its_own_card_not_a_prefix_of_it():
    """`h100-nvl` (the key the grid prints) is the H100 NVL, not the H100 its pattern would find."""
    named = profile_named(shipped(), "h100-nvl")
    assert named is not None and named.gpu == "h100-nvl"


def test_a_borrowed_card_is_planned_and_named_as_itself():
    env = resolve(shipped(), "L40S")
    assert (env.profile, env.card, env.gpu.name) == ("4090", "l40s", "NVIDIA L40S")
    assert env.memory["card"]["mib"] == 46068
    assert env.overrides.gpu_memory is None  # (the card's name carries its size)
    assert resolve(shipped(), "4090").card is None


def test_check_of_a_borrowed_card_never_names_the_profiles_card(cli):
    code, out, err = cli("check", "A10")
    said = out + err
    assert "RTX 3090" not in said and "NVIDIA A10" in said
    assert "envbuild show 3090" not in said


def test_check_titles_a_40gb_a100_as_itself(cli):
    code, out, _ = cli("check", "A100-SXM4-40GB", "--algo", "grpo")
    assert code == 0, out
    assert out.startswith("OK: a100-40gb resolves") and "NVIDIA A100-SXM4-40GB" in out
    assert "A100 80GB" not in out and "profile a100" in out


def test_render_of_a_borrowed_card_writes_its_own_folder(cli, tmp_path):
    code, out, err = cli("render", "L40S", "-o", str(tmp_path / "out"))
    assert code == 0, out + err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["l40s"]
    folder = tmp_path / "out" / "l40s"
    readme = (folder / "README.md").read_text()
    title = readme.splitlines()[0]
    assert title.startswith("# l40s: NVIDIA L40S") and "profile 4090" in title
    assert "RTX 4090" not in readme.split("## Next steps")[0].replace(title, "")
    assert "envbuild render l40s`" in readme and "--gpu-memory" not in readme
    data = json.loads((folder / "envbuild.json").read_text())
    assert (data["profile"], data["card"], data["gpu"]["name"]) == ("4090", "l40s", "NVIDIA L40S")


def test_a_replayed_borrowed_card_keeps_its_folder(cli, tmp_path):
    assert cli("render", "L40S", "-o", str(tmp_path / "a"))[0] == 0
    code, out, err = cli(
        "render", "--from", str(tmp_path / "a" / "l40s" / "envbuild.json"), "-o", str(tmp_path / "b")
    )
    assert code == 0, out + err
    assert (tmp_path / "b" / "l40s" / "envbuild.json").read_bytes() == (
        tmp_path / "a" / "l40s" / "envbuild.json"
    ).read_bytes()


def _verdict(m, name):
    try:
        resolve(m, name, check_fixes=False, pick_stack=False)
        return "ok"
    except ResolveError:
        return "refused"
    except UserError:
        return "none"


def test_grid_and_check_agree_on_every_card():
    """Each card of the matrix, through the grid's as-shipped column and through check by its
    key: a card check resolves has a row the grid resolves (✓, or ~/✗ where check refuses), a
    card check knows no profile for is the grid's · row."""
    from envbuilder.render import grid as G

    m = shipped()
    g = G.build(m)
    for card in m.gpus:
        rows = [i for i, r in enumerate(g.rows) if r.gpu == card]
        assert rows, card
        for i in rows:
            row = g.rows[i]
            cell = g.cells[None][(i, 0)]
            asked = row.asked
            if cell.state == "none":
                assert _verdict(m, card) == "none", card
            else:
                want = "ok" if cell.state == "ok" else "refused"
                assert _verdict(m, asked) == want, (card, asked, cell.state)
        own = [n for n, p in m.profiles.items() if p["gpu"] == card]
        if not own and _verdict(m, card) != "none":
            [i] = rows
            assert g.rows[i].profile is not None and g.rows[i].asked == card


def test_the_grid_names_a_borrowed_card_and_its_profile():
    from envbuilder.render import grid as G

    m = shipped()
    g = G.build(m, ("l40s",))
    assert [(r.gpu, r.profile, r.asked) for r in g.rows] == [("l40s", "4090", "l40s")]
    assert g.cells[None][(0, 0)].command.startswith("envbuild render l40s")
    assert "l40s (4090)" in G.text(g, None)


def test_a_known_card_is_no_did_you_mean():
    """RTX 3080 and Tesla P100 are cards of the matrix: the 3080 resolves as itself on the 3090's
    stack; the P100 is named as a card no profile runs on, never offered a100."""
    try:  # (a 10 GB card: the 3090's default run may not fit it; the refusal names the card)
        said = resolve(shipped(), "RTX 3080").gpu.name
    except ResolveError as e:
        said = str(e)
    assert "NVIDIA GeForce RTX 3080" in said and "did you mean" not in said and "rtx-pro-6000" not in said
    with pytest.raises(UserError) as e:
        resolve(shipped(), "Tesla P100")
    assert "did you mean" not in str(e.value) and "'a100'" not in str(e.value)


def test_detect_names_a_borrowed_card_by_its_own_name():
    from envbuilder.machine.detect import Machine, identify, parse_query, recommend

    m = shipped()
    gpus, driver = parse_query("0, NVIDIA L40S, 8.9, 46068, 580.95.05")
    rec = recommend(m, identify(m, Machine(tuple(gpus), driver, "13.0", "nvidia-smi")))
    fit = rec.fits[0]
    assert fit.name == "l40s" and fit.profile == "4090"
    assert "--gpu-memory" not in fit.flags


def test_a_command_without_profile_takes_the_card_by_its_own_name():
    """render/doctor/build without PROFILE on an L40S machine: the l40s (its own memory), not
    the 4090 profile planned for the 4090's 24 GB."""
    import subprocess

    from test_detect import NO_NVML

    from envbuilder.machine.detect import QUERY
    from envbuilder.machine.doctor import Probes, implied_profile

    def smi(argv):
        if tuple(argv) == QUERY:
            return subprocess.CompletedProcess(argv, 0, "0, NVIDIA L40S, 8.9, 46068, 580.95.05\n", "")
        return subprocess.CompletedProcess(argv, 0, "| Driver Version: 580.95.05  CUDA Version: 13.0 |\n", "")

    said = []
    assert implied_profile(shipped(), "render", Probes(nvml=NO_NVML, run=smi), said.append) == "l40s"
    assert "profile 4090 best, as l40s" in said[0]


def test_no_file_of_a_borrowed_card_is_headed_or_replayed_as_the_profile(cli, tmp_path):
    """Every header, label and command a rendered folder prints names the card asked for: the
    profile appears only as the stack it takes (its lock, its pins), never as the title (issue
    44's Low item: 'titles follow the profile, not the card planned') nor as a command that
    would plan for the profile's own card."""
    code, out, err = cli("render", "L40S", "--algo", "grpo", "-o", str(tmp_path / "out"))
    assert code == 0, out + err
    folder = tmp_path / "out" / "l40s"
    texts = {p.name: p.read_text() for p in folder.rglob("*") if p.is_file()}
    for name, text in texts.items():
        assert "profile 4090: RTX 4090" not in text, name
        for verb in ("render", "show", "check", "build", "doctor"):
            assert f"envbuild {verb} 4090" not in text, (name, verb)
        assert "4090.sif" not in text, name
    docker = texts["Dockerfile"]
    assert docker.splitlines()[0].startswith("# Rendered by envbuild ") and (
        "for l40s: NVIDIA L40S on profile 4090's stack" in docker.splitlines()[0]
    )
    assert 'org.opencontainers.image.title="envbuild l40s"' in docker
    assert "l40s: NVIDIA L40S on profile 4090's stack" in texts["apptainer.def"]
    assert "apptainer build l40s.sif" in texts["apptainer.def"]


def test_show_of_a_borrowed_card_heads_with_the_card():
    from envbuilder.render.summary import show_text

    text = show_text(shipped(), "L40S")
    first = text.splitlines()[0]
    assert first.startswith("card       l40s: NVIDIA L40S on profile 4090's stack"), first
    assert "profile    4090: " in text  # (the stack it takes, on a line of its own)
    assert show_text(shipped(), "4090").startswith("profile    4090: ")


@pytest.mark.parametrize(
    "typed, line",
    [
        ("H100 PCIe", "board      a PCIe card; PCIe between the GPUs of one node (no NVLink)"),
        ("h100", "board      an SXM module; NVLink/NVSwitch between the GPUs of one node"),
        ("gh200", "board      a superchip; NVLink/NVSwitch between the GPUs of one node"),
    ],
)
def test_show_states_the_cards_identity(typed, line):
    from envbuilder.render.summary import show_text

    assert line in show_text(shipped(), typed).splitlines()


def test_the_grid_and_check_say_the_same_of_a_card_no_build_runs_on():
    """The P100 (CC 6.0, no profile's build runs on it): the grid's · cell and check's refusal
    say the same thing, and neither offers a profile's name as a guess."""
    from envbuilder.render import grid as G

    m = shipped()
    g = G.build(m, ("p100",))
    summary = g.cells[None][(0, 0)].summary
    with pytest.raises(UserError) as e:
        resolve(m, "p100")
    assert "no profile's build runs on the Tesla P100 (CC 6.0)" in summary
    assert "a card no profile's build runs on" in str(e.value) and "did you mean" not in str(e.value)


def test_a_launcher_for_a_borrowed_card_builds_names_and_checks_the_card(tmp_path, monkeypatch):
    """`envbuild launch slurm L40S`: the image it asks for is `envbuild build l40s` (planned for
    the L40S's 48 GB), its script and job are named l40s, and the check the script runs first
    refuses an image rendered for profile 4090's own card (the same stack, other batch sizes)."""
    import subprocess
    import sys

    from envbuilder.engines import launch as L
    from envbuilder.render.files import render_files

    m = shipped()
    card, profile = resolve(m, "L40S"), resolve(m, "4090")
    assert L.build_command(card).startswith("envbuild build l40s")
    monkeypatch.chdir(tmp_path)
    said: list[str] = []
    path = L.write_slurm(m, "L40S", None, sif="/x.sif", say=said.append)
    assert path.name == "l40s.sbatch" and "envbuild build l40s" in said[-1]
    assert "#SBATCH --job-name=envbuild-l40s" in path.read_text() or "job-name=l40s" in path.read_text()
    record = tmp_path / "envbuild.json"

    def check(record_env):
        record.write_text(render_files(BuildContext.of(record_env))["envbuild.json"])
        argv = [sys.executable, "-c", L.IMAGE_CHECK, str(record), *L.check_args(card)]
        return subprocess.run(argv, capture_output=True, text=True)

    assert check(card).returncode == 0
    r = check(profile)
    assert r.returncode == 2 and "4090 (this job: l40s)" in r.stderr, r.stderr


def test_an_apptainer_definition_of_a_borrowed_card_is_named_for_it(cli, tmp_path):
    """`envbuild apptainer L40S --image .../envbuild/l40s@...` (the image `build L40S` names):
    written to l40s.def, no note that the image is named for another profile; an image of the
    4090 profile's own card gets that note."""
    digest = "sha256:" + "0123456789abcdef" * 4
    code, out, err = cli("apptainer", "L40S", "--image", f"127.0.0.1:5000/envbuild/l40s@{digest}")
    assert code == 0, err
    assert (tmp_path / "l40s.def").is_file() and not (tmp_path / "4090.def").exists()
    assert "not named after" not in err
    code, out, err = cli("apptainer", "L40S", "--image", f"127.0.0.1:5000/envbuild/4090@{digest}", "--force")
    assert code == 0 and "is not named after l40s" in err, err


@pytest.mark.parametrize("typed", ["L40S", "NVIDIA L40S", "l40s"])
def test_grid_takes_a_card_as_check_does(typed):
    """`grid --gpu L40S` shows the row `check L40S` resolves (it knew keys and profiles only)."""
    from envbuilder.render import grid as G

    g = G.build(shipped(), (typed,))
    assert [(r.gpu, r.asked) for r in g.rows] == [("l40s", "l40s")]
