"""`envbuild apptainer`: an Apptainer definition of a profile's image. Apptainer is not
installable here, so the file is read two ways: with spython's SingularityParser (a third-party
reader of Singularity/Apptainer recipes) and with the splitting rules of Apptainer's own parser
(pkg/build/types/parser/deffile.go: a line whose first word starts with `%` opens a section, a
line starting with `Bootstrap:` opens a stage, `#` lines are comments), transcribed below. The
shell parts are checked with bash -n, sourced under `env -i`, and run against a stub `python`.
No network, no Docker; `apptainer build` itself is not run."""

from __future__ import annotations

import io
import json
import re
import shlex
import shutil
import subprocess
import sys
import tarfile

import pytest
from spython.main.parse.parsers import SingularityParser

from conftest import PROFILES, resolved
from mounts import full_folder, mounted  # noqa: F401  (a fixture)
from envbuilder.engines.apptainer import HEADER, definition
from envbuilder.render.files import PREFLIGHT, smoke_command
from envbuilder.errors import UserError
from envbuilder.render.files import render_files
from envbuilder.render.context import BuildContext

DIGEST = "sha256:" + "0123456789abcdef" * 4
REGISTRY = "127.0.0.1:5000"


def image(profile: str) -> str:
    return f"{REGISTRY}/envbuild/{profile}@{DIGEST}"


class Parser(SingularityParser):
    """spython's parser, which records the header's bootstrap agent (it keeps only From) and
    reads an oci-archive header too (its own check knows only docker)."""

    bootstrap = None

    def _check_bootstrap(self, line):
        # (spython takes any line that holds the word "bootstrap" for a header line, even in a
        # section, where Apptainer reads only a line that starts with `Bootstrap:`): the first
        self.bootstrap = self.bootstrap or line.split(":", 1)[1].strip()


def parse(path):
    p = Parser(str(path))
    recipe = p.recipe["spython-base"]
    # spython turns %test into `echo "LINE" >> /tests.sh` steps; the lines, back
    tests = [m[1] for line in recipe.install if (m := re.fullmatch(r'echo "(.*)" >> /tests\.sh', line))]
    return p.bootstrap, recipe, tests


def sections(text: str) -> tuple[list[dict[str, str]], dict[str, str]]:
    """Apptainer's own split of a definition (deffile.go, All and scanDefinitionFile): stages
    at each line starting with `Bootstrap:`, in each a header then sections at each line whose
    first word starts with `%`. Returns the stages' headers (comment lines skipped, key: value)
    and the last stage's sections by name (body text)."""
    starts = [m.start() for m in re.finditer(r"(?mi)^bootstrap:", text)]
    stages = [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]
    headers, body = [], {}
    for stage in stages:
        header, current = {}, None
        body = {}
        for line in stage.splitlines():
            words = line.split()
            if words and words[0].startswith("%"):
                current = words[0][1:].lower()
                assert current not in body, f"section {current} twice"
                body[current] = ""
            elif current is None:
                line = line.strip()
                if line and not line.startswith("#"):
                    key, _, value = line.split("#")[0].partition(":")
                    header[key.strip().lower()] = value.strip()
            else:
                body[current] += line + "\n"
        headers.append(header)
    return headers, body


def labels_of(section: str) -> dict[str, str]:
    """GetLabels: key, a space, the rest of the line (trimmed)."""
    out = {}
    for line in section.strip().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            out[key.strip()] = value.strip()
    return out


def expected_environment(d: dict) -> dict[str, str]:
    env = {"VIRTUAL_ENV": "/opt/venv", "PYTHONDONTWRITEBYTECODE": "1", "HF_ENDPOINT": d["huggingface"]}
    if (d.get("cuda_alloc_conf") or {}).get("value"):
        env["PYTORCH_CUDA_ALLOC_CONF"] = d["cuda_alloc_conf"]["value"]
    if not d["features"]["torch_compile"]:
        env["TORCHDYNAMO_DISABLE"] = "1"
    return env


def sourced(script: str, tmp_path, shell: str = "bash") -> dict[str, str]:
    """The environment after sourcing `script` in `shell` started with nothing but PATH."""
    f = tmp_path / "environment.sh"
    f.write_text(script)
    r = subprocess.run(
        [
            "env",
            "-i",
            "PATH=/usr/bin:/bin",
            shell,
            "-c",
            f'set -e; . {shlex.quote(str(f))}; exec "{sys.executable}" -c '
            '"import json, os; print(json.dumps(dict(os.environ)))"',
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    return json.loads(r.stdout)


@pytest.mark.parametrize("profile", PROFILES)
def test_each_profile_definition_parses_with_what_the_image_needs(cli, tmp_path, profile):
    code, out, err = cli("apptainer", profile, "--image", image(profile))
    assert code == 0, err
    path = tmp_path / f"{profile}.def"  # (the cli fixture runs in tmp_path)
    assert out.strip() == f"{profile}.def"
    assert f"apptainer build {profile}.sif" in err and f"apptainer run --nv {profile}.sif" in err
    text = path.read_text()
    assert text.startswith(HEADER + " ")
    d = resolved(profile).to_dict()

    # spython's reading
    bootstrap, recipe, tests = parse(path)
    assert bootstrap == "docker"
    assert recipe.fromHeader == image(profile).lower()  # (spython lower-cases From)
    labels = dict(line.split(" ", 1) for line in recipe.labels)
    assert labels["io.envbuild.profile"] == profile
    assert labels["io.envbuild.gpu"] == d["gpu"]["key"]
    assert labels["io.envbuild.gpu-name"] == d["gpu"]["name"]
    assert labels["io.envbuild.cuda"] == d["cuda"]["version"]
    assert labels["io.envbuild.torch"] == f"{d['torch']['version']}+{d['torch']['variant']}"
    assert labels["io.envbuild.verl"] == d["verl"]["version"]
    assert labels["io.envbuild.image-digest"] == DIGEST
    assert labels["io.envbuild.image"] == image(profile)
    assert labels["io.envbuild.version"] == d["envbuild_version"]
    expected = expected_environment(d)
    assert recipe.environ == [f"{k}={shlex.quote(v)}" for k, v in expected.items()] + [
        'PATH=/opt/venv/bin:"$PATH"'
    ]
    assert len(tests) == 1 and shlex.split(tests[0]) == smoke_command()
    assert recipe.cmd == 'exec /opt/envbuild/run_ppo_gsm8k.sh "$@"'

    # Apptainer's own split: one stage, its header, exactly these sections
    headers, body = sections(text)
    assert headers == [{"bootstrap": "docker", "from": image(profile)}]
    assert sorted(body) == ["environment", "help", "labels", "runscript", "test"]
    assert labels_of(body["labels"]) == labels
    assert f"apptainer build {profile}.sif {profile}.def" in body["help"]
    assert f"apptainer run --nv {profile}.sif" in body["help"]

    # %environment: valid shell that exports exactly the values (bash and the POSIX sh)
    subprocess.run(["bash", "-n"], input=body["environment"], text=True, check=True)
    for shell in ["bash", *(["sh"] if shutil.which("sh") else [])]:
        got = sourced(body["environment"], tmp_path, shell)
        for k, v in expected.items():
            assert got[k] == v, (shell, k)
        assert got["PATH"] == "/opt/venv/bin:/usr/bin:/bin"
        # nothing else exported: only these differ from sourcing an empty script
        before = sourced("", tmp_path, shell)
        assert {k for k in got if got[k] != before.get(k)} == {*expected, "PATH"}


@pytest.mark.parametrize("profile", ["p40", "h200"])
def test_environment_matches_the_images_env(cli, tmp_path, profile):
    """What %environment sets is what the rendered Dockerfile's ENV sets."""
    assert cli("apptainer", profile, "--image", image(profile))[0] == 0
    _, body = sections((tmp_path / f"{profile}.def").read_text())
    env = sourced(body["environment"], tmp_path)
    dockerfile = render_files(BuildContext.of(resolved(profile)))["Dockerfile"]
    assert f"ARG HF_ENDPOINT={env['HF_ENDPOINT']}\n" in dockerfile
    assert ("ENV TORCHDYNAMO_DISABLE=1" in dockerfile) == ("TORCHDYNAMO_DISABLE" in env)
    assert "VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH" in dockerfile
    # the run script and preflight.py sit where %runscript and %test look for them
    assert re.search(r"^COPY preflight\.py run_ppo_gsm8k\.sh.* /opt/envbuild/$", dockerfile, re.M)
    assert PREFLIGHT == "/opt/envbuild/preflight.py"


def test_test_section_runs_exactly_the_builds_smoke_command(cli, tmp_path):
    """%test, run by a POSIX shell, hands `python` exactly the arguments `envbuild build`'s
    smoke test runs in the image (a stub python prints what it got)."""
    assert cli("apptainer", "t4", "--image", image("t4"))[0] == 0
    _, body = sections((tmp_path / "t4.def").read_text())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "python"
    stub.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    stub.chmod(0o755)
    subprocess.run(["bash", "-n"], input=body["test"], text=True, check=True)
    r = subprocess.run(
        ["env", "-i", f"PATH={bin_dir}", shutil.which("sh") or "/bin/sh", "-c", body["test"]],
        capture_output=True,
        text=True,
        check=True,
    )
    assert ["python", *json.loads(r.stdout)] == smoke_command()
    # %runscript: the launch script, with the run's arguments
    subprocess.run(["bash", "-n"], input=body["runscript"], text=True, check=True)
    assert shlex.split(body["runscript"]) == ["exec", "/opt/envbuild/run_ppo_gsm8k.sh", "$@"]


def oci_archive(path, digest=DIGEST, manifests=1):
    index = {
        "schemaVersion": 2,
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": 1234}
        ]
        * manifests,
    }
    with tarfile.open(path, "w") as tar:
        for name, data in [
            ("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
            ("index.json", json.dumps(index).encode()),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_oci_archive_variant(cli, tmp_path):
    archive = oci_archive(tmp_path / "p40.tar")
    code, out, err = cli("apptainer", "p40", "--oci-archive", "p40.tar", "-o", "hpc.def")
    assert code == 0, err
    path = tmp_path / "hpc.def"
    bootstrap, recipe, tests = parse(path)
    assert bootstrap == "oci-archive"
    assert recipe.fromHeader == str(archive).lower()
    labels = dict(line.split(" ", 1) for line in recipe.labels)
    assert labels["io.envbuild.image"] == str(archive)  # an absolute path
    assert labels["io.envbuild.image-digest"] == DIGEST  # the archive's own manifest
    assert shlex.split(tests[0]) == smoke_command()
    text = path.read_text()
    headers, body = sections(text)
    assert headers == [{"bootstrap": "oci-archive", "from": str(archive)}]
    assert "apptainer build hpc.sif hpc.def" in body["help"]


def test_oci_archive_not_written_yet_is_named_without_a_digest(cli, tmp_path):
    code, out, err = cli("apptainer", "p40", "--oci-archive", tmp_path / "later.tar")
    assert code == 0, err
    assert "does not exist yet" in err
    _, recipe, _ = parse(tmp_path / "p40.def")
    assert not any(line.startswith("io.envbuild.image-digest") for line in recipe.labels)


@pytest.mark.parametrize(
    "make",
    [
        lambda p: p.write_bytes(b"not a tar"),
        lambda p: oci_archive(p, manifests=2),
        lambda p: tarfile.open(p, "w").close(),
    ],
)
def test_a_file_that_is_no_oci_archive_is_refused(cli, tmp_path, make):
    make(tmp_path / "x.tar")
    code, out, err = cli("apptainer", "p40", "--oci-archive", tmp_path / "x.tar")
    assert code == 2 and "not an OCI image archive" in err
    assert not (tmp_path / "p40.def").exists()


def test_an_archive_path_the_header_cannot_carry_is_refused(cli, tmp_path):
    code, out, err = cli("apptainer", "p40", "--oci-archive", tmp_path / "my image#1.tar")
    assert code == 2 and "Move or rename" in err


@pytest.mark.parametrize(
    "ref",
    [
        f"{REGISTRY}/envbuild/p40:latest",
        f"{REGISTRY}/envbuild/p40",
        "envbuild/p40:0123456789ab",
    ],
)
def test_a_reference_without_a_digest_is_refused(cli, tmp_path, ref):
    code, out, err = cli("apptainer", "p40", "--image", ref)
    assert code == 2
    assert "names no digest" in err and "a tag can move" in err
    assert not (tmp_path / "p40.def").exists()


@pytest.mark.parametrize(
    "ref",
    [
        f"{REGISTRY}/envbuild/p40@sha256:abc",  # a short digest
        f"{REGISTRY}/envbuild/p40@sha256:{'A' * 64}",
        f"{REGISTRY}/envbuild/p40 #x@{DIGEST}",
        f"{REGISTRY}/envbuild/p40@{DIGEST}\n%post",
        f"{REGISTRY}/Envbuild/p40@{DIGEST}",
    ],
)
def test_a_malformed_reference_is_refused(cli, tmp_path, ref):
    code, out, err = cli("apptainer", "p40", "--image", ref)
    assert code == 2 and "is not an image reference" in err
    assert not (tmp_path / "p40.def").exists()


def test_a_tag_and_digest_and_a_docker_scheme_are_taken(cli, tmp_path):
    ref = f"docker://{REGISTRY}/envbuild/p40:v1@{DIGEST}"
    assert cli("apptainer", "p40", "--image", ref)[0] == 0
    headers, _ = sections((tmp_path / "p40.def").read_text())
    assert headers == [{"bootstrap": "docker", "from": ref[len("docker://") :]}]


def test_image_and_archive_are_one_or_the_other(cli, tmp_path):
    assert cli("apptainer", "p40")[0] == 2
    oci_archive(tmp_path / "a.tar")
    code, out, err = cli("apptainer", "p40", "--image", image("p40"), "--oci-archive", "a.tar")
    assert code == 2 and "not both" in err


def test_an_image_named_for_another_profile_gets_a_note(cli, tmp_path):
    code, out, err = cli("apptainer", "p40", "--image", image("t4"))
    assert code == 0 and "is not named after profile p40" in err
    code, out, err = cli("apptainer", "p40", "--image", image("p40"))
    assert code == 0 and "not named after" not in err


def test_a_file_envbuild_did_not_write_is_kept_unless_forced(cli, tmp_path):
    mine = tmp_path / "p40.def"
    mine.write_text("Bootstrap: docker\nFrom: ubuntu:22.04\n")
    code, out, err = cli("apptainer", "p40", "--image", image("p40"))
    assert code == 2 and "envbuild did not write it" in err and "--force" in err
    assert mine.read_text() == "Bootstrap: docker\nFrom: ubuntu:22.04\n"
    assert cli("apptainer", "p40", "--image", image("p40"), "--force")[0] == 0
    assert mine.read_text().startswith(HEADER)
    # its own file is replaced without --force (a new digest), atomically: no temp file left
    other = "sha256:" + "f" * 64
    assert cli("apptainer", "p40", "--image", f"{REGISTRY}/envbuild/p40@{other}")[0] == 0
    assert f"From: {REGISTRY}/envbuild/p40@{other}\n" in mine.read_text()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == []
    # a folder, or a file in a folder that is not there
    (tmp_path / "d").mkdir()
    assert cli("apptainer", "p40", "--image", image("p40"), "-o", tmp_path / "d")[0] == 2
    code, out, err = cli("apptainer", "p40", "--image", image("p40"), "-o", tmp_path / "no" / "x.def")
    assert code == 2 and "does not exist" in err


def test_mirror_sets_hf_endpoint(cli, tmp_path):
    assert cli("apptainer", "p40", "--image", image("p40"), "--mirror", "cn")[0] == 0
    _, body = sections((tmp_path / "p40.def").read_text())
    assert sourced(body["environment"], tmp_path)["HF_ENDPOINT"] == "https://hf-mirror.com"


def test_a_mirror_joins_the_definition_through_prepare(cli, tmp_path, monkeypatch):
    """--mirror cn joins the environment in context.prepare, the one place a mirror set joins
    one: the definition is the one of prepare(env, mirror=cn)'s environment."""
    from conftest import shipped
    from envbuilder.context import prepare as P
    from envbuilder.model import mirrors as M

    asked = []
    real = P.prepare

    def spy(env, **kw):
        asked.append(kw.get("mirror"))
        return real(env, **kw)

    monkeypatch.setattr(P, "prepare", spy)
    assert cli("apptainer", "p40", "--image", image("p40"), "--mirror", "cn")[0] == 0
    choice = M.choice("cn", M.get_set(shipped(), "cn"))
    assert asked == [choice]
    env = M.split_credentials(resolved("p40"))[0]
    want = definition(real(env, mirror=choice).env, image("p40"), "docker", DIGEST, "p40.def")
    assert (tmp_path / "p40.def").read_text() == want
    assert "https://hf-mirror.com" in want


def test_overrides_reach_the_labels(cli, tmp_path):
    assert cli("apptainer", "4090", "--image", image("4090"), "--torch", "2.5.1")[0] == 0
    _, recipe, _ = parse(tmp_path / "4090.def")
    assert "io.envbuild.torch 2.5.1+cu121" in recipe.labels


def hostile(name: str, **changes):
    env = resolved(name)
    d = json.loads(env.to_json())
    for path, value in changes.items():
        node = d
        *parents, last = path.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    return type(env).from_plain(d)  # (past the file checks: the guard behind them is tested)


def test_a_hostile_value_cannot_add_a_section_or_a_stage(tmp_path):
    """Values that reached the template past the schema (which refuses them where they enter)
    stay inside their line: a line break comes out as its escape, so no `%section` or
    `Bootstrap:` line appears and every label reads back as exactly one line."""
    evil = "x\n%runscript\n    rm -rf ~\nBootstrap: docker\nFrom: evil/image\n%post\n    id"
    env = hostile(
        "p40",
        **{
            "gpu.name": evil,
            "description": evil,
            "profile": "p40\n%post",
            "verl.version": "0.4.1\r%setup",
            "rollout": "hf\u2028%files",
        },
    )
    text = definition(env, image("p40"), "docker", DIGEST, "p40.def")
    path = tmp_path / "p40.def"
    path.write_text(text)
    headers, body = sections(text)
    assert headers == [{"bootstrap": "docker", "from": image("p40")}]
    assert sorted(body) == ["environment", "help", "labels", "runscript", "test"]
    labels = labels_of(body["labels"])
    assert labels["io.envbuild.gpu-name"] == evil.encode("unicode_escape").decode()
    assert labels["io.envbuild.profile"] == "p40\\n%post"
    assert labels["io.envbuild.verl"] == "0.4.1\\r%setup"
    assert labels["io.envbuild.rollout"] == "hf\\u2028%files"
    assert body["runscript"].strip() == 'exec /opt/envbuild/run_ppo_gsm8k.sh "$@"'
    assert "rm -rf" not in body["runscript"] + body["test"] + body["environment"]
    bootstrap, recipe, _ = parse(path)
    assert bootstrap == "docker" and recipe.fromHeader == image("p40").lower()
    assert recipe.cmd == 'exec /opt/envbuild/run_ppo_gsm8k.sh "$@"'
    # past the header (two comments, Bootstrap, From), every line starts with a word envbuild
    # wrote; and no character of the file ends a line for any reader (splitlines: \r, \u2028)
    assert text.splitlines() == text.split("\n")[:-1]
    for line in text.splitlines()[4:]:
        assert not line.lstrip().startswith(("%post", "%setup", "%files", "Bootstrap", "From"))


def test_a_hostile_environment_value_stays_one_value(tmp_path):
    """Shell metacharacters in an %environment value are exported as themselves; a control
    character, which the POSIX sh of %environment cannot carry, is refused."""
    value = "https://h.example/$(touch pwned)`touch pwned2`'\"; touch pwned3 #"
    env = hostile(
        "p40", huggingface=value, **{"cuda_alloc_conf.value": "expandable_segments:True'; touch pwned4; '"}
    )
    _, body = sections(definition(env, image("p40"), "docker", DIGEST, "p40.def"))
    got = sourced(body["environment"], tmp_path)
    assert got["HF_ENDPOINT"] == value
    assert got["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True'; touch pwned4; '"
    assert not list(tmp_path.glob("pwned*"))
    with pytest.raises(UserError, match="control character"):
        definition(
            hostile("p40", huggingface="https://h.example\n%post"), image("p40"), "docker", DIGEST, "p40.def"
        )


def test_help_lists_the_command(cli):
    code, out, err = cli("--help")
    assert code == 0 and "apptainer" in out
    code, out, err = cli("apptainer", "--help")
    assert code == 0 and "--oci-archive" in out and "--image" in out


@pytest.mark.parametrize("kind", ["read-only", "full"])
def test_apptainer_into_a_read_only_or_full_folder_is_exit_1_and_leaves_no_file(
    run_envbuild, tmp_path, mounted, kind
):
    """Before: an internal error (OSError: Read-only file system / No space left). Failed
    before the fix: yes."""
    folder = mounted("ro,size=64k") if kind == "read-only" else full_folder(mounted)
    before = sorted(p.name for p in folder.iterdir())
    r = run_envbuild(
        "apptainer",
        "t4",
        "--image",
        "127.0.0.1:5000/envbuild/t4@sha256:" + "a" * 64,
        "-o",
        folder / "t4.def",
        env={"XDG_CONFIG_HOME": str(tmp_path)},
    )
    assert r.returncode == 1, r.stderr
    assert str(folder / "t4.def") in r.stderr
    assert sorted(p.name for p in folder.iterdir()) == before
