"""--model: the model a user trains, from the table, a folder's config.json, or the hub's
config.json through a Hugging Face endpoint (a loopback one serving the real files here)."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import FIXTURES, shipped
from envbuilder.model.architectures import arch_from_config
from envbuilder.errors import UserError
from envbuilder.model.arch import Arch
from faultserver import FaultServer

HF = FIXTURES / "hf"


def config(repo: str) -> dict:
    return json.loads((HF / repo / "config.json").read_text())


def hub_files() -> dict[str, bytes]:
    return {
        f"{p.parent.relative_to(HF)}/resolve/main/config.json": p.read_bytes()
        for p in HF.rglob("config.json")
    }


@pytest.fixture
def run(cli, monkeypatch):
    """envbuild in-process (conftest's cli): (exit code, stdout + stderr); env= sets variables."""
    monkeypatch.delenv("HF_ENDPOINT", raising=False)

    def go(*args, env=None):
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
        code, out, err = cli(*args)
        return code, out + err

    return go


@pytest.fixture
def hub():
    with FaultServer(hub_files()) as server:
        yield server


def test_a_config_json_gives_the_shape_the_table_records():
    rec = arch_from_config(config("Qwen/Qwen2-7B-Instruct"), "config.json", "Qwen/Qwen2-7B-Instruct")
    table = dict(shipped().models["Qwen/Qwen2-7B-Instruct"])
    assert {k: v for k, v in rec.items() if k != "source"} == {
        k: v for k, v in table.items() if k != "source"
    }


@pytest.mark.parametrize(
    "repo,params", [("meta-llama/Llama-3.1-8B-Instruct", 8_030_261_248), ("Qwen/Qwen3-8B", 8_190_735_360)]
)
def test_other_families_count_the_parameters_their_cards_state(repo, params):
    rec = arch_from_config(config(repo), "config.json", repo)
    assert rec["parameters"] == params == Arch(repo, rec).params()


def test_a_qwen3_moe_counts_every_expert_as_its_card_states():
    # "30.5B in total and 3.3B activated": the plan's state is the total, all 128 experts
    rec = arch_from_config(config("Qwen/Qwen3-30B-A3B"), "config.json", "Qwen/Qwen3-30B-A3B")
    assert (rec["experts"], rec["experts_per_token"], rec["moe_intermediate_size"]) == (128, 8, 768)
    assert rec["parameters"] == 30_532_122_624 == shipped().models["Qwen/Qwen3-30B-A3B"]["parameters"]
    a = Arch("m", rec)
    assert a.I_act == 8 * 768
    assert a.I_act * 2 == Arch("m", dict(rec, experts_per_token=16)).I_act  # activations: a token's experts
    active = a.params() - a.L * (a.E - a.topk) * 3 * a.H * a.Ie
    assert 3.3e9 < active < 3.4e9


def test_a_mixture_of_experts_the_plan_does_not_count_is_refused_with_the_reason():
    cfg = config("Qwen/Qwen3-30B-A3B")
    with pytest.raises(UserError, match="mixture-of-experts.*num_local_experts"):
        arch_from_config(
            dict(cfg, model_type="mixtral", num_local_experts=8, num_experts=None), "config.json", "mixtral"
        )
    # (a DeepSeek config without MLA's fields is not one the plan can count: it names the field)
    with pytest.raises(UserError, match="qk_nope_head_dim"):
        arch_from_config(dict(cfg, model_type="deepseek_v3", n_routed_experts=256), "config.json", "dsv3")
    with pytest.raises(UserError, match="mixes dense and expert layers"):
        arch_from_config(dict(cfg, mlp_only_layers=[0]), "config.json", "q")


def test_an_unknown_layout_is_refused_with_the_reason():
    with pytest.raises(UserError, match="'gpt2' model.*knows the layouts"):
        arch_from_config({"model_type": "gpt2"}, "config.json", "gpt2")
    for bad in (
        [],
        {"model_type": "llama", "num_hidden_layers": "32"},
        {"model_type": "llama", "num_hidden_layers": 10**9},
    ):
        with pytest.raises(UserError):
            arch_from_config(bad, "config.json", "x")


def test_a_local_folder_sizes_the_plan_and_names_the_run_scripts_model(tmp_path, run):
    folder = tmp_path / "my-llama"
    shutil.copytree(HF / "meta-llama" / "Llama-3.1-8B-Instruct", folder)
    code, out = run("render", "h100", "--model", folder, "-o", tmp_path / "out")
    assert code == 0, out
    script = (tmp_path / "out" / "h100" / "run_ppo_gsm8k.sh").read_text()
    assert f"MODEL=${{MODEL:-{folder}}}" in script
    spec = json.loads((tmp_path / "out" / "h100" / "envbuild.json").read_text())
    assert spec["train"]["model"] == str(folder)
    assert spec["overrides"]["model"] == str(folder) and "model_arch" not in spec["overrides"]
    code, default = run("show", "h100", "--memory")
    code2, mine = run("show", "h100", "--memory", "--model", folder)
    assert code == code2 == 0 and default != mine and "8.03B" in mine


def test_a_folder_without_config_json_and_a_missing_folder_are_refused(tmp_path, run):
    (tmp_path / "empty").mkdir()
    for arg, why in ((tmp_path / "empty", "no config.json"), (tmp_path / "nope", "no such folder")):
        code, out = run("show", "h100", "--model", arg)
        assert code == 2 and why in out, out


def test_a_hub_model_is_read_through_hf_endpoint_once_then_from_the_cache(hub, tmp_path, run):
    env = {"HF_ENDPOINT": hub.url("")}
    code, out = run("render", "h100", "--model", "Qwen/Qwen3-8B", "-o", tmp_path / "a", env=env)
    assert code == 0, out
    assert len(hub.requests_for("Qwen/Qwen3-8B/resolve/main/config.json")) == 1
    assert "MODEL=${MODEL:-Qwen/Qwen3-8B}" in (tmp_path / "a" / "h100" / "run_ppo_gsm8k.sh").read_text()
    hub.script["Qwen/Qwen3-8B/resolve/main/config.json"] = [503] * 5  # the hub is down now
    code, out = run("render", "h100", "--model", "Qwen/Qwen3-8B", "-o", tmp_path / "b", env=env)
    assert code == 0, out  # the cached config.json answered: no request reached the hub
    assert len(hub.requests_for("Qwen/Qwen3-8B/resolve/main/config.json")) == 1
    assert (tmp_path / "a" / "h100" / "run_ppo_gsm8k.sh").read_bytes() == (
        tmp_path / "b" / "h100" / "run_ppo_gsm8k.sh"
    ).read_bytes()


def test_an_unknown_repo_a_dead_endpoint_and_an_endless_body_each_say_what_to_do(hub, tmp_path, run):
    code, out = run("show", "h100", "--model", "nobody/nothing", env={"HF_ENDPOINT": hub.url("")})
    assert code == 2 and "no such repo" in out, out
    from httpfixtures import closed_port_url

    code, out = run(
        "show", "h100", "--model", "Qwen/Qwen3-8B", env={"HF_ENDPOINT": closed_port_url("").rstrip("/")}
    )
    assert code == 1 and "HF_ENDPOINT" in out and "--model /path/to/model" in out, out
    hub.script["Qwen/Qwen3-8B/resolve/main/config.json"] = ["endless"]
    hub.files["big/x/resolve/main/config.json"] = b"{" * 10
    code, out = run("show", "h100", "--model", "Qwen/Qwen3-8B", env={"HF_ENDPOINT": hub.url("")})
    assert code == 1 and "more than 1024 KiB" in out, out


def test_credentials_in_hf_endpoint_are_never_printed(tmp_path, run):
    from httpfixtures import closed_port_url

    url = closed_port_url("").rstrip("/").replace("http://", "http://user:s3cret@")
    code, out = run("show", "h100", "--model", "Qwen/Qwen3-8B", env={"HF_ENDPOINT": url})
    assert code == 1 and "s3cret" not in out and "***@" in out, out


def test_a_model_whose_context_is_shorter_than_the_profiles_sequences_is_refused(tmp_path, run):
    folder = tmp_path / "short"
    folder.mkdir()
    cfg = dict(config("Qwen/Qwen2-7B-Instruct"), max_position_embeddings=256)
    (folder / "config.json").write_text(json.dumps(cfg))
    code, out = run("show", "h100", "--model", folder)
    assert code == 2 and "[model-context]" in out and "256 tokens" in out, out


def test_a_model_too_big_for_the_card_names_a_smaller_one_that_resolves(run):
    code, out = run("show", "4090", "--model", "Qwen/Qwen2-7B-Instruct")
    assert code == 2 and "[memory]" in out, out
    fix = out.split("use --model ", 1)[1].split(" ", 1)[0]
    assert run("show", "4090", "--model", fix)[0] == 0


@pytest.mark.parametrize("kind", [["qwen2"], {"qwen2": 1}, 7, None])
@pytest.mark.parametrize("where", ["folder", "hub"])
def test_a_model_type_that_is_no_name_is_refused_clearly(hub, tmp_path, run, kind, where):
    """Issue 33 #10: a config.json whose model_type is a list or an object (from a folder or the
    hub) ended in `TypeError: unhashable type`, an internal error. It is refused (exit 2)
    naming the value. (On the code before, the list and the object raised.)"""
    cfg = dict(config("Qwen/Qwen3-8B"), model_type=kind)
    if where == "folder":
        folder = tmp_path / "odd"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg))
        code, out = run("show", "h100", "--model", folder)
    else:
        repo = f"odd/{type(kind).__name__}"  # (one repo a case: the hub's answers are cached)
        hub.files[f"{repo}/resolve/main/config.json"] = json.dumps(cfg).encode()
        code, out = run("show", "h100", "--model", repo, env={"HF_ENDPOINT": hub.url("")})
    assert code == 2, out
    assert "the memory plan knows the layouts" in out and repr(kind)[:20] in out


def test_the_hub_cache_is_sealed(hub, tmp_path, run, monkeypatch):
    """Issue 33 #16: hf-config-*.json entries were plain cache files, though every entry is
    sealed (docs/reference.md): one planted in the cache folder (another model's shape) was
    read as the hub's answer. Now an entry is read only under this user's seal. (On the code
    before, the planted entry sized the plan offline.)"""
    import hashlib
    import os

    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    folder = cache / "envbuild"
    folder.mkdir(parents=True, mode=0o700)
    os.chmod(folder, 0o700)
    endpoint = hub.url("").rstrip("/")
    url = f"{endpoint}/Qwen/Qwen3-8B/resolve/main/config.json"
    entry = folder / f"hf-config-{hashlib.sha256(url.encode()).hexdigest()[:32]}.json"
    entry.write_text(json.dumps(config("meta-llama/Llama-3.1-8B-Instruct")))  # not Qwen3-8B's
    code, out = run(
        "show", "h100", "--model", "Qwen/Qwen3-8B", env={"HF_ENDPOINT": endpoint, "ENVBUILD_OFFLINE": "1"}
    )
    assert code == 2 and "not cached" in out, out
    entry.unlink()
    code, out = run(
        "show", "h100", "--model", "Qwen/Qwen3-8B", env={"HF_ENDPOINT": endpoint, "ENVBUILD_OFFLINE": ""}
    )
    assert code == 0, out
    assert entry.read_text().startswith("envbuild-sealed 1 ")
    code, out = run(
        "show", "h100", "--model", "Qwen/Qwen3-8B", env={"HF_ENDPOINT": endpoint, "ENVBUILD_OFFLINE": "1"}
    )
    assert code == 0, out  # (its own sealed entry answers offline)


# -- issue 33 #3: the hub through the one HTTP session -------------------------------------------


def test_hf_token_never_follows_a_redirect_to_another_origin(hub, run):
    """urllib copied Authorization to every hop, so a hub (or a mirror) that redirected
    config.json elsewhere handed HF_TOKEN to that host. The token goes to the endpoint's own
    scheme, host and port only. (On the code before, the other server saw the Bearer token.)"""
    with FaultServer({"cdn/config.json": json.dumps(config("Qwen/Qwen3-8B")).encode()}) as other:
        hub.script["Qwen/Qwen3-8B/resolve/main/config.json"] = [("redirect", other.url("cdn/config.json"))]
        env = {"HF_ENDPOINT": hub.url("").rstrip("/"), "HF_TOKEN": "hf_s3cretTOKEN"}
        code, out = run("show", "h100", "--model", "Qwen/Qwen3-8B", env=env)
        assert code == 0, out
        (first,) = hub.requests_for("Qwen/Qwen3-8B/resolve/main/config.json")
        assert first.authorization == "Bearer hf_s3cretTOKEN"
        (second,) = other.requests_for("cdn/config.json")
        assert second.authorization is None
        assert "s3cret" not in out


def test_credentials_in_hf_endpoint_are_basic_auth_to_that_host(hub, run):
    """HF_ENDPOINT=http://user:pass@host sent `user:pass@host` to the resolver as a host name
    (urllib); it is Basic auth to that host now, and never printed."""
    url = hub.url("").rstrip("/").replace("http://", "http://user:s3cret@")
    code, out = run("show", "h100", "--model", "Qwen/Qwen3-8B", env={"HF_ENDPOINT": url})
    assert code == 0, out
    (got,) = hub.requests_for("Qwen/Qwen3-8B/resolve/main/config.json")
    assert got.authorization and got.authorization.startswith("Basic ")
    assert "s3cret" not in out


def test_a_hub_that_drips_is_cut_at_the_deadline(hub, tmp_path):
    """A server sending a byte every so often never times out a read: `show --model` was held
    for as long as it dripped (80 s at a byte every 2 s in the report; the cap allowed days).
    The whole exchange has a deadline now (HUB_DEADLINE; shrunk here through DEADLINE_SCALE).
    (On the code before, this run was killed at the test's limit.)"""
    import subprocess
    import sys
    import time

    from conftest import clean_env

    hub.script["Qwen/Qwen3-8B/resolve/main/config.json"] = ["drip"]
    code = (
        "import sys; import envbuilder.oci.http as H; H.DEADLINE_SCALE = 0.05\n"
        "from envbuilder.cli import main; main(sys.argv[1:])"
    )
    start = time.monotonic()
    try:
        r = subprocess.run(
            [sys.executable, "-c", code, "show", "h100", "--model", "Qwen/Qwen3-8B"],
            env=clean_env(HF_ENDPOINT=hub.url("").rstrip("/"), XDG_CACHE_HOME=str(tmp_path / "c")),
            capture_output=True,
            text=True,
            timeout=40,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("show --model was held by a dripping hub past 40 s")
    assert r.returncode == 1 and "no complete answer within" in r.stderr, r.stderr
    assert time.monotonic() - start < 30


def test_mirror_points_the_model_lookup_at_the_mirrors_hub(hub, run_envbuild, tmp_path):
    """`render 4090 --mirror cn --model X` read huggingface.co: the mirror set's Hugging Face
    endpoint is where a hub model's config.json is read now (a flag before HF_ENDPOINT).
    (On the code before, the request went to HF_ENDPOINT, here a closed port.)"""
    import yaml
    from httpfixtures import closed_port_url

    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        yaml.safe_dump({"mirrors": {"lab": {"description": "lab", "huggingface": [hub.url("").rstrip("/")]}}})
    )
    env = {"ENVBUILD_CONFIG": str(cfg), "HF_ENDPOINT": closed_port_url("").rstrip("/")}
    r = run_envbuild(
        "render", "h100", "--mirror", "lab", "--model", "Qwen/Qwen3-8B", "-o", tmp_path / "out", env=env
    )
    assert r.returncode == 0, r.stderr
    assert len(hub.requests_for("Qwen/Qwen3-8B/resolve/main/config.json")) == 1
