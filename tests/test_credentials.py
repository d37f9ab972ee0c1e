"""The credential rule, checked on every printed line and every written file: a URL's
user:password@ is a secret from every source; a command prints it as `***@` and no file names it.

The overlay here is the whole shipped matrix with `user:password@` planted in every URL it
holds (indexes, the hub, mirror sets, apex's and uv's URLs, flash-attn's releases, every
`sources:` citation): 200-odd keys. Every command that needs no network and no Docker runs on
it, and its output and every file it writes are scanned for the password (issue 33 #4: on the
code before, `show`, `show --json` and `grid --html` carried it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SECRET = "pl4nted-Pw0rd"
URL = re.compile(r"^([a-z][a-z0-9+.-]*://)([^/@\s]+)")
DIGEST = "sha256:" + "a" * 64


def plant(node):
    """`node` with user:SECRET@ in every URL (one without userinfo yet)."""
    if isinstance(node, str):
        return URL.sub(rf"\g<1>user:{SECRET}@\g<2>", node, count=1) if URL.match(node) else node
    if isinstance(node, dict):
        return {k: plant(v) for k, v in node.items()}
    if isinstance(node, list):
        return [plant(v) for v in node]
    return node


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("planted")
    count = 0
    for f in sorted((ROOT / "matrices").glob("*.yaml")):
        doc = yaml.safe_load(f.read_text())
        text = yaml.safe_dump(plant(doc), sort_keys=False)
        count += text.count(SECRET)
        (folder / f.name).write_text(text)
    assert count > 150, count  # (every URL of the matrix)
    return folder


def commands(tmp: Path, planted: Path) -> list[list]:
    out = tmp / "out"
    return [
        ["list"],
        ["list", "--json"],
        ["show", "p40"],
        ["show", "p40", "--json"],
        ["show", "4090", "--memory"],
        ["show", "4090", "--memory", "--json"],
        ["check", "p40"],
        ["check", "t4", "--rollout", "hf"],
        ["affected", planted],
        ["affected", planted, "--json"],
        ["grid", "--gpu", "p40", "--details"],
        ["grid", "--gpu", "p40", "--html", out / "grid.html"],
        ["render", "--all", "-o", out / "all"],
        ["render", "4090", "--mirror", "cn", "-o", out / "cn"],
        ["render", "p40", "--locked", "-o", out / "locked"],
        ["bake", "--all", "-o", out / "bake"],
        ["apptainer", "p40", "--image", f"registry.example/envbuild/p40@{DIGEST}", "-o", out / "p40.def"],
        ["launch", "slurm", "h100", "--nodes", "2", "--sif", "/x.sif", "-o", out / "job.sbatch"],
        [
            "launch",
            "kuberay",
            "h100",
            "--nodes",
            "2",
            "--image",
            f"registry.example:5000/envbuild/h100@{DIGEST}",
            "-o",
            out / "job.yaml",
        ],
        ["sbom", "4090"],
        ["mirrors", "list"],
    ]


def test_no_command_prints_or_writes_a_planted_password(cli, planted, tmp_path):
    (tmp_path / "out").mkdir()
    seen = []
    for args in commands(tmp_path, planted):
        code, out, err = cli(*args, "--matrix-dir", planted)
        seen.append((args[:2], code))
        assert SECRET not in out + err, (
            args,
            [line for line in (out + err).splitlines() if SECRET in line][:3],
        )
    written = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert len(written) > 100  # (every profile's rendered files, the bake file, the launchers)
    leaked = [str(p) for p in written if SECRET.encode() in p.read_bytes()]
    assert not leaked, leaked
    # every one ran; these refuse (a refusal's message is scanned too): t4's verl has no HF
    # rollout, and the planted indexes stale p40's and 4090's locks
    refused = [args for args, code in seen if code not in (0, None)]
    assert refused == [["check", "t4"], ["render", "p40"], ["sbom", "4090"]], seen


def test_show_prints_credentials_as_stars(cli, planted):
    code, out, err = cli("show", "p40", "--matrix-dir", planted)
    assert code in (0, None), err
    assert "from https://***@download.pytorch.org/whl/cu118" in out
    code, out, err = cli("show", "p40", "--json", "--matrix-dir", planted)
    assert code in (0, None), err
    assert '"pypi": "https://***@pypi.org/simple"' in out


# a password as users paste them: '@' and ':' raw (requests, uv and pip split the userinfo at the
# LAST '@' of the authority, its user and password at the first ':')
HARD = "Re@Tail77:x!$&*+,;=~"


@pytest.mark.parametrize(
    "url, shown, bare",
    [
        (f"http://alice:{HARD}@host:8080/simple", "http://***@host:8080/simple", "http://host:8080/simple"),
        (f"https://a:{HARD}@h", "https://***@h", "https://h"),
        (f"https://a:{HARD}@h?x=1@2", "https://***@h?x=1@2", "https://h?x=1@2"),
        (
            f"https://h/p@q and http://u:{HARD}@k/",
            "https://h/p@q and http://***@k/",
            "https://h/p@q and http://k/",
        ),
        ("https://h#frag@x", "https://h#frag@x", "https://h#frag@x"),
    ],
)
def test_redact_splits_userinfo_at_the_last_at_sign_of_the_authority(url, shown, bare):
    from envbuilder.images import flash_attn_wheel
    from envbuilder.text import redact, without_credentials

    assert redact(url) == shown
    assert without_credentials(url) == bare
    assert "Tail77" not in redact(url)
    # the image's standalone copy (standard library only) says the same of one URL
    assert "Tail77" not in flash_attn_wheel._redacted(url.split(" ")[-1])


@pytest.mark.parametrize(
    "command, option",
    [
        ("verify", "--index-url"),
        ("verify", "--torch-index-url"),
        ("install", "--index-url"),
        ("install", "--torch-index-url"),
        ("refresh", "--index-url"),
    ],
)
def test_a_refused_index_url_is_echoed_without_its_password(cli, tmp_path, command, option):
    prefix = ["--prefix", tmp_path / "env"] if command == "install" else []
    profile = [] if command == "refresh" else ["p40"]
    code, out, err = cli(command, *profile, *prefix, option, f"ftp://alice:{HARD}@host/simple")
    assert code == 2, (out, err)
    assert "is not an" in err and "'ftp://***@host/simple'" in err
    assert "Tail77" not in out + err
