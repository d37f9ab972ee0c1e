"""A CycloneDX 1.6 SBOM of a profile, from its lock (lockfiles/<profile>/): every pip package
with its version, purl and sha256s, the conda packages, the base images by digest, apex's and
flash-attn's sources (URL and sha256), and the recorded patches envbuild applies to verl, with
their reasons (as the verl component's pedigree).

Deterministic: the same lock and environment give the same bytes. There is no timestamp (a lock
records none), and the serial number is derived from the content. `envbuild sbom` writes it,
and `render --locked` puts the same file into the build context (the image's
/opt/envbuild/sbom.cdx.json, its sha256 in the `io.envbuild.sbom-sha256` label).
"""

from __future__ import annotations


import hashlib
import json
import uuid
from pathlib import PurePosixPath
from collections.abc import Mapping
from typing import TypedDict
from urllib.parse import quote, urlsplit

from envbuilder.lock.documents import CondaLock, LockMeta, SourcePin
from envbuilder.model.components import registry as COMPONENTS
from envbuilder.model.resolved import ResolvedEnv
from envbuilder.render.image import HOME, SBOM as SBOM_PATH

SPEC_VERSION = "1.6"
FILE = "sbom.cdx.json"  # in the rendered folder, and in the image under /opt/envbuild/
IN_IMAGE = SBOM_PATH
ROOT_REF = "envbuild-image"
_CONDA_EXTS = (".conda", ".tar.bz2")


class Hash(TypedDict):
    alg: str
    content: str


class _Reference(TypedDict):
    type: str
    url: str


class Reference(_Reference, total=False):
    hashes: list[Hash]


# a CycloneDX component, as the SBOM lists it ("bom-ref" is no Python name)
_Component = TypedDict(
    "_Component",
    {
        "type": str,
        "bom-ref": str,
        "name": str,
        "version": str,
        "purl": str,
        "hashes": list[Hash],
        "properties": list[dict[str, str]],
    },
)


class Component(_Component, total=False):
    externalReferences: list[Reference]
    pedigree: dict[str, object]  # (verl's: the patches envbuild applies, patch_pedigree)


def _q(text: str) -> str:
    """A purl component: percent-encoded except what the purl spec leaves bare."""
    return quote(text, safe="")


def _purl(kind: str, name: str, version: str, namespace: str = "", **qualifiers: str | None) -> str:
    ns = f"{'/'.join(_q(p) for p in namespace.split('/'))}/" if namespace else ""
    out = f"pkg:{kind}/{ns}{_q(name)}@{_q(version)}"
    given = sorted((k, v) for k, v in qualifiers.items() if v)
    if given:
        out += "?" + "&".join(f"{k}={quote(str(v), safe='/:')}" for k, v in given)
    return out


def _prop(name: str, value: object) -> dict[str, str]:
    return {"name": f"envbuild:{name}", "value": str(value)}


def pip_components(env: ResolvedEnv, requirements: str) -> tuple[list[Component], dict[str, list[str]]]:
    """(components, {bom-ref: refs of what it pulls in}) of requirements.lock: one component per
    package, every sha256 the lock allows for it (the files of its release that pip may take)."""
    from envbuilder.lock.pins import parse

    locked = parse(requirements)
    torch_index = env.torch.index_url
    torch_own = {p.split("==")[0].split("[")[0].lower() for p in env.torch.packages}
    refs: dict[str, str] = {}
    out: list[Component] = []
    for name, entry in sorted(locked.items()):
        repo = torch_index if torch_index and name in torch_own else None
        ref = _purl("pypi", name, entry.version, repository_url=repo)
        refs[name] = ref
        out.append(
            {
                "type": "library",
                "bom-ref": ref,
                "name": name,
                "version": entry.version,
                "purl": ref,
                "hashes": [{"alg": "SHA-256", "content": h.split(":", 1)[1]} for h in sorted(entry.hashes)],
                "properties": [_prop("manager", "pip")]
                + ([_prop("direct", "true")] if "" in entry.parents else []),
            }
        )
    children: dict[str, list[str]] = {ref: [] for ref in refs.values()}
    for name, entry in locked.items():
        for parent in entry.parents:
            if parent in refs:
                children[refs[parent]].append(refs[name])
    return out, {k: sorted(set(v)) for k, v in children.items()}


def conda_components(conda_lock: CondaLock) -> list[Component]:
    """The conda packages of conda-lock.yml (its pip entries are requirements.lock's)."""
    out: list[Component] = []
    for p in sorted(conda_lock.package, key=lambda p: (p.name, str(p.version), p.url)):
        if p.manager != "conda":
            continue
        path = PurePosixPath(urlsplit(p.url).path)
        subdir, filename = path.parent.name, path.name
        channel = p.url[: p.url.rindex(f"/{subdir}/")]
        stem = next((filename[: -len(e)] for e in _CONDA_EXTS if filename.endswith(e)), filename)
        prefix = f"{p.name}-{p.version}-"
        build = stem[len(prefix) :] if stem.startswith(prefix) else None
        kind = next((e.lstrip(".") for e in _CONDA_EXTS if filename.endswith(e)), None)
        ref = _purl("conda", p.name, str(p.version), build=build, channel=channel, subdir=subdir, type=kind)
        hashes: list[Hash] = [{"alg": "SHA-256", "content": p.hash.sha256}] if p.hash.sha256 else []
        hashes += [{"alg": "MD5", "content": p.hash.md5}] if p.hash.md5 else []
        out.append(
            {
                "type": "library",
                "bom-ref": ref,
                "name": p.name,
                "version": str(p.version),
                "purl": ref,
                "hashes": hashes,
                "externalReferences": [{"type": "distribution", "url": p.url}],
                "properties": [_prop("manager", "conda")],
            }
        )
    return out


def image_components(env: ResolvedEnv, images: Mapping[str, str]) -> list[Component]:
    """The base images (runtime, devel) at the digests the lock recorded."""
    out: list[Component] = []
    for role, ref in sorted(env.cuda.images.items()):
        if ref not in images:
            continue
        digest = images[ref]
        repo, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "")
        host = repo.split("/")[0]
        full = repo if "." in host or ":" in host or host == "localhost" else f"docker.io/{repo}"
        if full.startswith("docker.io/") and "/" not in full[len("docker.io/") :]:
            full = f"docker.io/library/{full[len('docker.io/') :]}"
        purl = _purl("oci", full.rsplit("/", 1)[-1].lower(), digest, repository_url=full, tag=tag or None)
        out.append(
            {
                "type": "container",
                "bom-ref": f"{purl}#{role}",
                "name": full,
                "version": digest,
                "purl": purl,
                "hashes": [{"alg": "SHA-256", "content": digest.split(":", 1)[1]}],
                "properties": [_prop("image-role", role), _prop("image-reference", ref)],
            }
        )
    return out


def _megatron_source(env: ResolvedEnv, key: str, s: SourcePin) -> COMPONENTS.Source | None:
    """On the Megatron engine, TransformerEngine's extension's sdist (compiled for the card) and
    the PyPI wheels of the CUDA compiler and build requirements it is built with offline."""
    from envbuilder.lock.sources import TE_KEY, TOOLCHAIN_KEY

    if not env.megatron or s.ref is None:
        return None
    if key == TE_KEY:
        return COMPONENTS.Source(TE_KEY, s.ref, "pypi", compiled=True)
    if key.startswith(TOOLCHAIN_KEY):
        return COMPONENTS.Source(key.removeprefix(TOOLCHAIN_KEY), s.ref, "pypi")
    return None


def source_components(env: ResolvedEnv, sources: Mapping[str, SourcePin]) -> list[Component]:
    """The files of sources.lock a registered component is built from (registry.Source): apex's
    source archive and flash-attn's release wheels (each ABI the lock pins)."""
    out: list[Component] = []
    for key, s in sorted(sources.items()):
        src = next((x for c in COMPONENTS.REGISTRY if (x := c.source(env, key, s.ref)) is not None), None)
        if src is None:
            src = _megatron_source(env, key, s)
        if src is None:
            continue
        name, version = src.name, src.version
        where = {"download_url": s.url, "file_name": s.filename} if src.kind == "pypi" else {}
        purl = _purl(src.kind, name, version, namespace=src.namespace, **where)
        out.append(
            {
                "type": "library",
                "bom-ref": f"envbuild-source:{key}",
                "name": name,
                "version": version,
                "purl": purl,
                "hashes": [{"alg": "SHA-256", "content": s.sha256}],
                "externalReferences": [
                    {
                        "type": "distribution",
                        "url": s.url,
                        "hashes": [{"alg": "SHA-256", "content": s.sha256}],
                    }
                ],
                "properties": [_prop("source", key)]
                + ([_prop("compiled-for", f"sm_{env.gpu.sm}")] if src.compiled else []),
            }
        )
    return out


def patch_pedigree(env: ResolvedEnv) -> dict[str, object] | None:
    """The recorded patches that apply_patches.py applies to the installed verl: each as an
    unofficial patch whose `resolves` names it and says why (matrices/patches.yaml), and whose
    diff is its replacement rules (the find and with texts, per file)."""
    if not env.patches:
        return None
    patches = []
    for p in env.patches:
        rules = json.dumps({"files": list(p.files), "replace": [dict(r) for r in p.replace]}, sort_keys=True)
        patches.append(
            {
                "type": "unofficial",
                "diff": {"text": {"contentType": "application/json", "content": rules}},
                "resolves": [{"type": "defect", "id": p.name, "name": p.name, "description": p.why}],
            }
        )
    return {"patches": patches, "notes": f"applied to the installed verl by {HOME}/apply_patches.py"}


def build(
    env: ResolvedEnv,
    meta: LockMeta,
    requirements: str,
    conda_lock: CondaLock | None = None,
    images: Mapping[str, str] | None = None,
    sources: Mapping[str, SourcePin] | None = None,
    missing: dict[str, str] | None = None,
) -> str:
    """The SBOM's JSON text (sorted keys, two-space indent, a final newline) of a lock: its
    lock.json `meta`, the pip pins (requirements.lock's text, or a wheelhouse's with its built
    wheels' hashes) and its other parts as lockfile.parse read them (None: not locked).
    lockfile.sbom_text_of is the one caller that reads a lock folder. No URL's user:password@
    reaches it (an overlay's index may carry one): the SBOM is a file, copied into the image.
    `missing` ({part: why}): the parts of the environment the lock does not pin (a pip-only
    lock); the SBOM then declares itself incomplete (CycloneDX `compositions`: the image's
    assembly `incomplete`, the pip part's `complete`) and names each missing part and why."""
    from envbuilder.model.mirrors import split_credentials

    env = split_credentials(env)[0]
    pip, children = pip_components(env, requirements)
    verl_ref = next((c["bom-ref"] for c in pip if c["name"] == "verl"), None)
    pedigree = patch_pedigree(env)
    if pedigree:
        for c in pip:
            if c["bom-ref"] == verl_ref:
                c["pedigree"] = pedigree
    conda = conda_components(conda_lock) if conda_lock else []
    image_list = image_components(env, images) if images else []
    source_list = source_components(env, sources) if sources else []
    components = image_list + conda + pip + source_list
    direct = [c["bom-ref"] for c in pip if _prop("direct", "true") in c["properties"]]
    root_depends = sorted({c["bom-ref"] for c in image_list + conda + source_list} | set(direct))
    properties = [
        _prop("profile", env.name),
        _prop("gpu", env.gpu.name),
        _prop("cuda", env.cuda.version),
        _prop("python", env.python),
        _prop("lock-input-sha256", meta.input_sha256),
        _prop("lock-parts", ",".join(sorted(meta.parts))),
    ] + [_prop(f"lock-file-sha256:{n}", d) for n, d in sorted(meta.files.items())]
    if missing:
        properties += [_prop(f"not-locked:{part}", why) for part, why in sorted(missing.items())]
    bom: dict[str, object] = {
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "version": 1,
        "metadata": {
            "tools": {
                "components": [{"type": "application", "name": "envbuild", "version": env.envbuild_version}]
            },
            "component": {
                "type": "container",
                "bom-ref": ROOT_REF,
                "name": f"envbuild/{env.asked}",
                "version": meta.input_sha256,
                "description": f"envbuild's {env.asked} image: {env.gpu.name}, CUDA {env.cuda.version}, "
                f"torch {env.torch.version}+{env.torch.variant}, verl {env.verl.version}",
            },
            "properties": properties,
        },
        "components": components,
        "dependencies": [{"ref": ROOT_REF, "dependsOn": root_depends}]
        + [{"ref": ref, "dependsOn": deps} for ref, deps in sorted(children.items())]
        + [{"ref": c["bom-ref"], "dependsOn": []} for c in image_list + conda + source_list],
    }
    if missing:
        bom["compositions"] = [
            {"aggregate": "incomplete", "assemblies": [ROOT_REF]},
            {"aggregate": "complete", "assemblies": sorted(c["bom-ref"] for c in pip)},
        ]
    body = json.dumps(bom, sort_keys=True).encode()
    bom["serialNumber"] = f"urn:uuid:{uuid.UUID(bytes=hashlib.sha256(body).digest()[:16], version=5)}"
    return json.dumps(bom, indent=2, sort_keys=True) + "\n"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
