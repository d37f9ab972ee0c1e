"""`envbuild sbom` (issue 24): a CycloneDX 1.6 SBOM from a lock, validated by
cyclonedx-python-lib's own JSON validator; the same bytes a `render --locked` folder carries
(and its Dockerfile copies into the image, its sha256 in a label); refused exactly as
`render --locked` refuses a missing, stale or partial lock. The lock here is the 4090's
fixture lock (pip and images); the whole lock (conda, sources) is tests/test_lock.py's, and the
image is tests/test_build.py's."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from envbuilder.cli import main

REPO = Path(__file__).resolve().parents[1]
LOCKS = REPO / "tests" / "fixtures" / "locks"


def envbuild(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(map(str, args)))
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def validate(text: str) -> None:
    """cyclonedx-python-lib's strict JSON validator for CycloneDX 1.6: None, or the error."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    assert error is None, str(error)[:3000]


@pytest.fixture(scope="module")
def sbom_4090(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("sbom") / "4090.cdx.json"
    with pytest.raises(SystemExit) as exit_:
        main(["sbom", "4090", "--lock-dir", str(LOCKS), "-o", str(out)])
    assert exit_.value.code == 0
    return out.read_text()


def test_the_sbom_validates_as_cyclonedx_1_6(sbom_4090):
    validate(sbom_4090)
    doc = json.loads(sbom_4090)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.6"
    assert re.fullmatch(r"urn:uuid:[0-9a-f-]{36}", doc["serialNumber"])
    assert "timestamp" not in doc["metadata"]  # (a lock records none)


def test_the_validator_can_fail(sbom_4090):
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    doc = json.loads(sbom_4090)
    doc["components"][0]["hashes"][0]["alg"] = "SHA-257"
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(doc)) is not None


def test_every_pip_package_of_the_lock_with_its_version_purl_and_sha256s(sbom_4090):
    from envbuilder.lock.pip import parse

    locked = parse((LOCKS / "4090" / "requirements.lock").read_text())
    pip = {c["name"]: c for c in json.loads(sbom_4090)["components"] if c["purl"].startswith("pkg:pypi/")}
    assert set(pip) == set(locked)
    for name, entry in locked.items():
        c = pip[name]
        assert c["version"] == entry.version
        assert c["purl"] == f"pkg:pypi/{name}@{entry.version}"
        assert {f"sha256:{h['content']}" for h in c["hashes"]} == set(entry.hashes)


def test_the_base_images_by_digest(sbom_4090):
    images = json.loads((LOCKS / "4090" / "images.lock").read_text())
    found = {
        next(p["value"] for p in c["properties"] if p["name"] == "envbuild:image-reference"): c
        for c in json.loads(sbom_4090)["components"]
        if c["type"] == "container"
    }
    assert set(found) == set(images)
    for ref, c in found.items():
        assert c["version"] == images[ref]["digest"]
        assert c["purl"].startswith("pkg:oci/cuda@sha256%3A" + images[ref]["digest"][7:])
        assert f"tag={ref.split(':')[1]}" in c["purl"] and "repository_url=docker.io/nvidia/cuda" in c["purl"]


def test_the_patches_applied_to_verl_with_their_reasons(sbom_4090):
    from conftest import resolved

    env = resolved("4090")
    [verl] = [c for c in json.loads(sbom_4090)["components"] if c["name"] == "verl"]
    patches = verl["pedigree"]["patches"]
    assert [p["resolves"][0]["id"] for p in patches] == [p.name for p in env.patches]
    assert [p["resolves"][0]["description"] for p in patches] == [p.why for p in env.patches]
    for p, rec in zip(patches, env.patches):
        assert json.loads(p["diff"]["text"]["content"])["files"] == list(rec.files)


def test_the_sbom_is_deterministic_and_its_serial_number_follows_the_content(sbom_4090, capsys):
    code, out, err = envbuild(capsys, "sbom", "4090", "--lock-dir", LOCKS)  # (to standard output)
    assert code == 0, err
    assert out == sbom_4090
    # other pins (one hash less) are another SBOM, with another serial number
    from conftest import resolved
    from envbuilder.lock import lockfile

    meta, texts = lockfile.verified(LOCKS / "4090", "4090")
    env = resolved("4090")
    assert lockfile.sbom_text_of(env, meta, texts, LOCKS / "4090") == sbom_4090
    requirements = texts["requirements.lock"]
    first = re.search(r" \\\n +--hash=sha256:[0-9a-f]{64}", requirements)[0]
    other = lockfile.sbom_text_of(env, meta, texts, LOCKS / "4090", requirements.replace(first, "", 1))
    assert json.loads(other)["serialNumber"] != json.loads(sbom_4090)["serialNumber"]
    validate(other)


def test_render_locked_carries_the_same_sbom_and_labels_its_sha256(sbom_4090, tmp_path, capsys):
    code, _, err = envbuild(capsys, "render", "4090", "--locked", LOCKS, "-o", tmp_path)
    assert code == 0, err
    folder = tmp_path / "4090"
    assert (folder / "sbom.cdx.json").read_text() == sbom_4090
    import dockerfile

    parsed = dockerfile.parse_string((folder / "Dockerfile").read_text())
    copies = [c.value for c in parsed if c.cmd == "COPY"]
    assert ("sbom.cdx.json", "/opt/envbuild/sbom.cdx.json") in copies
    label = next(c for c in parsed if c.cmd == "LABEL")
    labels = dict(zip(label.value[::2], label.value[1::2]))
    assert labels["io.envbuild.sbom-sha256"] == f'"{hashlib.sha256(sbom_4090.encode()).hexdigest()}"'
    # an unlocked render has neither
    code, _, err = envbuild(capsys, "render", "4090", "-o", tmp_path / "plain")
    assert code == 0, err
    assert not (tmp_path / "plain" / "4090" / "sbom.cdx.json").exists()
    assert "sbom" not in (tmp_path / "plain" / "4090" / "Dockerfile").read_text()


def _refusals(capsys, tmp_path, *flags) -> tuple[tuple, tuple]:
    """(sbom's (exit code, stderr), render --locked's) for the same lock folder and flags."""
    sbom = envbuild(capsys, "sbom", "4090", "-o", tmp_path / "s.json", *flags)
    lock_dir = flags[flags.index("--lock-dir") + 1] if "--lock-dir" in flags else None
    rest = [
        f
        for i, f in enumerate(flags)
        if f not in ("--lock-dir", "--require-complete") and (i == 0 or flags[i - 1] != "--lock-dir")
    ]
    render = envbuild(
        capsys,
        "render",
        "4090",
        "-o",
        tmp_path / "r",
        *(["--locked", lock_dir] if lock_dir else ["--locked"]),
        *rest,
    )
    return (sbom[0], sbom[2]), (render[0], render[2])


@pytest.mark.parametrize(
    "case", ["missing", "stale", "partial", "shipped pip-only"], ids=lambda c: c.replace(" ", "-")
)
def test_a_missing_stale_or_partial_lock_is_refused_as_render_locked_refuses_it(tmp_path, capsys, case):
    if case == "missing":
        flags = ["--lock-dir", str(tmp_path / "none")]
    elif case == "stale":
        flags = ["--lock-dir", str(LOCKS), "--verl", "0.5.0"]
    elif case == "partial":
        lock = tmp_path / "partial" / "4090"
        shutil.copytree(LOCKS / "4090", lock)
        (lock / "images.lock").unlink()
        flags = ["--lock-dir", str(tmp_path / "partial")]
    else:
        # lockfiles/4090: the shipped lock has no images part (--require-complete refuses it as
        # render --locked does; without it, test_the_shipped_pip_only_lock...)
        flags = ["--require-complete"]
    sbom, render = _refusals(capsys, tmp_path, *flags)
    assert sbom == render, (sbom, render)
    assert sbom[0] == 2 and "envbuild: error:" in sbom[1] and "Traceback" not in sbom[1]
    assert not (tmp_path / "s.json").exists() and not (tmp_path / "r").exists()


def test_o_never_replaces_a_file_envbuild_did_not_write(sbom_4090, tmp_path, capsys):
    other = tmp_path / "notes.json"
    other.write_text('{"mine": true}\n')
    code, _, err = envbuild(capsys, "sbom", "4090", "--lock-dir", LOCKS, "-o", other)
    assert code == 2 and "--force" in err
    assert other.read_text() == '{"mine": true}\n'
    code, _, err = envbuild(capsys, "sbom", "4090", "--lock-dir", LOCKS, "-o", other, "--force")
    assert code == 0 and other.read_text() == sbom_4090
    # its own SBOM it replaces without --force
    code, _, err = envbuild(capsys, "sbom", "4090", "--lock-dir", LOCKS, "-o", other)
    assert code == 0, err


INDEX = "application/vnd.oci.image.index.v1+json"


def _lock_for(env, tmp_path: Path) -> Path:
    """The shipped lock of env's profile, its lock.json re-stamped for `env`'s inputs (as
    `envbuild lock` would have stamped it, solving against the same index with a password)."""
    from envbuilder.lock import lockfile

    lock = tmp_path / "lock" / env.name
    shutil.copytree(REPO / "lockfiles" / env.name, lock)
    meta = json.loads((lock / "lock.json").read_text())
    meta.pop("torch_swapped", None)  # (as if the PyTorch index had answered)
    images = {
        ref: {"digest": "sha256:" + hashlib.sha256(ref.encode()).hexdigest(), "media_type": INDEX}
        for ref in sorted(set(env.cuda.images.values()))
    }
    (lock / "images.lock").write_text(lockfile.dumps(images))
    meta["files"]["images.lock"] = lockfile.sha256_text((lock / "images.lock").read_text())
    sources = {"apex": {"url": env.apex.url, "sha256": "0" * 64}}  # (p40 compiles apex)
    (lock / "sources.lock").write_text(lockfile.dumps(sources))
    meta["files"]["sources.lock"] = lockfile.sha256_text((lock / "sources.lock").read_text())
    meta["parts"] = sorted({*meta["parts"], "images", "sources"})
    meta["inputs"] = lockfile.input_digests(env, meta["parts"])
    meta["input_sha256"] = lockfile.input_sha256(meta["inputs"])
    (lock / "lock.json").write_text(lockfile.dumps(meta))
    return lock


def test_a_mirror_password_never_reaches_the_sbom(tmp_path, capsys):
    """Issue 33 #2: sbom and render --locked built the SBOM from the environment before its
    credentials were split off, so an overlay's torch index_url with user:pass@ landed in a
    purl's repository_url, and the Dockerfile copies sbom.cdx.json into the image. (On the code
    before, the password was in both.)"""
    from envbuilder.model import matrix as M
    from envbuilder.model.resolve import resolve

    secret = "s3cret-sbom-pw"
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "torch.yaml").write_text(
        f"index_url: https://user:{secret}@download.pytorch.org/whl/{{variant}}\n"
    )
    env = resolve(M.load((overlay,)), "p40")
    assert secret in env.torch.index_url  # (p40: a +cu118 torch from the PyTorch index)
    lock = _lock_for(env, tmp_path)
    code, out, err = envbuild(capsys, "sbom", "p40", "--matrix-dir", overlay, "--lock-dir", lock)
    assert code == 0, err
    assert secret not in out + err
    assert "repository_url=https://download.pytorch.org/whl/cu118" in out
    validate(out)
    code, out, err = envbuild(
        capsys, "render", "p40", "--matrix-dir", overlay, "--locked", lock, "-o", tmp_path / "r"
    )
    assert code == 0, err
    assert secret not in out + err
    for f in (tmp_path / "r" / "p40").rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f


def test_the_shipped_pip_only_lock_gives_an_sbom_that_declares_what_it_lacks(tmp_path, capsys):
    """Issue 36: `sbom 4090` refused the shipped lock, which pins only the pip part (no conda
    channel or registry was in reach where it was made). It now writes the pip part and declares
    the rest missing: CycloneDX compositions, the image's assembly `incomplete`, the pip
    packages `complete`, and a property naming each part that is not locked and why."""
    out = tmp_path / "4090.cdx.json"
    code, _, err = envbuild(capsys, "sbom", "4090", "-o", out)
    assert code == 0, err
    assert "does not pin conda, images" in err
    text = out.read_text()
    validate(text)
    doc = json.loads(text)
    incomplete, complete = doc["compositions"]
    assert incomplete == {"aggregate": "incomplete", "assemblies": ["envbuild-image"]}
    pip = {c["bom-ref"] for c in doc["components"] if c["purl"].startswith("pkg:pypi/")}
    assert complete["aggregate"] == "complete" and set(complete["assemblies"]) == pip and pip
    props = {p["name"]: p["value"] for p in doc["metadata"]["properties"]}
    assert "conda packages" in props["envbuild:not-locked:conda"]
    assert "base images" in props["envbuild:not-locked:images"]
    assert not any(c["purl"].startswith(("pkg:conda/", "pkg:oci/")) for c in doc["components"])
    # the fixture lock pins pip and the images: only conda is declared missing, as in the SBOM
    # a render --locked image carries
    other = json.loads(_whole(tmp_path, capsys))
    names = {p["name"] for p in other["metadata"]["properties"]}
    assert "envbuild:not-locked:conda" in names and "envbuild:not-locked:images" not in names


def _whole(tmp_path, capsys) -> str:
    out = tmp_path / "whole.cdx.json"
    assert envbuild(capsys, "sbom", "4090", "--lock-dir", str(LOCKS), "-o", out)[0] == 0
    return out.read_text()
