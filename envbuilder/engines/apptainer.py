"""An Apptainer (Singularity) definition file of a profile's image, for
clusters that run Apptainer rather than Docker (the library part of `envbuild apptainer`).

The definition installs nothing: it starts from the image `envbuild build` pushed, by digest
(`Bootstrap: docker`, a tag can move), or from an OCI archive of it (`Bootstrap: oci-archive`),
and adds what Apptainer keeps beside the image: labels, the run-time environment the image's ENV
sets, a %test that is the build's own smoke test, and a %runscript that starts the launch script.
It is one file written where the user says (default ./<profile>.def), never into a render's
folder, whose files are tracked by its record.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Callable

from envbuilder.errors import UserError
from envbuilder.render.image import VENV  # (the venv the image installs into)

if TYPE_CHECKING:
    from envbuilder.model.matrix import Matrix
    from envbuilder.model.resolved import Overrides, ResolvedEnv

TEMPLATE = "apptainer.def.j2"
# the first line of every file this command writes: a file that does not start with it is not
# envbuild's, and is replaced only with --force
HEADER = "# envbuild apptainer definition"
# name[:port]/path[:tag]@sha256:<64 hex>, as `envbuild build --push` prints it (the grammar of
# distribution's reference, lower-case path components; the host may be any DNS name or IP)
from envbuilder.oci.reference import REFERENCE as _REF  # noqa: E402  (the one grammar)

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# an OCI archive's index.json is a few hundred bytes; anything near this is not one
MAX_INDEX_BYTES = 1 << 20


def image_reference(ref: str) -> tuple[str, str]:
    """(reference, digest) of an --image value, which must name its digest."""
    text = ref.strip()
    if text.startswith("docker://"):
        text = text[len("docker://") :]
    m = _REF.fullmatch(text)
    if not m:
        raise UserError(
            f"--image {ref!r} is not an image reference (REGISTRY/NAME@sha256:DIGEST, "
            "64 lower-case hex digits). Pass the reference `envbuild build PROFILE "
            "--push REGISTRY` printed."
        )
    if not m["digest"]:
        raise UserError(
            f"--image {ref!r} names no digest: a tag can move, so the SIF could be "
            "built from an image other than the one envbuild built and tested. Pass "
            "the REGISTRY/NAME@sha256:... reference `envbuild build PROFILE --push "
            "REGISTRY` printed (or `docker inspect --format '{{index .RepoDigests 0}}' "
            "IMAGE`)."
        )
    return text, m["digest"]


def archive_digest(path: Path) -> str | None:
    """The manifest digest of an OCI archive (its index.json's one manifest), None when the
    file is not there yet; an archive that is not an OCI image layout is refused. index.json is
    read as import-image reads it (image_archive.index_manifests: the one bounded reader)."""
    import tarfile

    from envbuilder.engines.archive import index_manifests

    if not path.exists():
        return None
    bad = (
        f"--oci-archive {path} is not an OCI image archive (a tar with an index.json naming "
        "one image). Write one with `envbuild export-image`, `skopeo copy "
        "docker-daemon:IMAGE oci-archive:FILE` or `podman save --format oci-archive`."
    )
    try:
        with tarfile.open(path, "r:*") as tar:
            manifests = index_manifests(tar, path, bad)
    except UserError as e:
        raise UserError(str(e) if bad in str(e) else bad) from None
    except (OSError, tarfile.TarError, EOFError):
        raise UserError(bad) from None
    if len(manifests) != 1:
        raise UserError(bad.replace("(a tar", "with exactly one image (a tar"))
    digest = manifests[0]["digest"]
    return digest if _DIGEST.fullmatch(digest) else None


def archive_path(path: Path) -> Path:
    """The archive as the absolute path the header names; Apptainer's header is bare words
    (a `#` starts a comment there), so the path must be one plain token."""
    from envbuilder.render.quoting import BARE

    full = Path(os.path.abspath(path))
    if not BARE.fullmatch(str(full)[1:]):  # (after its leading `/`: the template's `word`)
        raise UserError(
            f"--oci-archive {str(full)!r} holds characters an Apptainer definition's "
            "header cannot carry (a space, quote, `#`, `$` or the like). Move or "
            "rename the archive to a plain path (letters, digits, '/', '.', '_', '-')."
        )
    return full


def labels(env: ResolvedEnv, source: str, digest: str | None) -> list[tuple[str, str]]:
    """%labels, key and value: the image's own io.envbuild.* labels (render/image.py) and where
    the SIF came from. Apptainer reads one label a line: key, a space, the rest of the line."""
    from envbuilder.render.image import LABEL, labels as image_labels

    out = [*image_labels(env, sif=True), (LABEL + "image", source)]
    if digest:
        out.append((LABEL + "image-digest", digest))
    return [(k, str(v)) for k, v in out]


def environment(env: ResolvedEnv) -> list[tuple[str, str]]:
    """%environment: what the image's ENV sets that matters when it runs (render/image.py),
    from the resolved environment, and the run script's allocator default. PATH is written
    after these, with $PATH."""
    from envbuilder.render.image import runtime_env

    alloc = env.cuda_alloc_conf
    # (the run script's default; none where the profile has none)
    defaults = [("PYTORCH_CUDA_ALLOC_CONF", alloc.value)] if alloc and alloc.value else []
    out = runtime_env(env, defaults)
    for name, value in out:  # (the schema refused these where they entered: a second wall)
        if not all(c == " " or c.isprintable() for c in str(value)):
            raise UserError(
                f"The value of {name} for profile {env.profile!r} holds a control "
                "character, which a POSIX shell's %environment cannot carry. Fix "
                "the matrix value it comes from."
            )
    return out


def from_word(source: str) -> str:
    """The header's `From:` value as one bare token (quoting.word); an archive's absolute path
    keeps its leading `/` (archive_path checked the rest)."""
    from envbuilder.render.quoting import word

    return "/" + word(source[1:]) if source.startswith("/") else word(source)


def definition(env: ResolvedEnv, source: str, bootstrap: str, digest: str | None, def_name: str) -> str:
    """The definition file's text for `env` (a ResolvedEnv) built from `source`."""
    from envbuilder.render.files import jinja_env, smoke_command
    from envbuilder.render.image import PREFLIGHT, RUN_SCRIPT_PATH

    sif = f"{PurePosixPath(def_name).stem or env.asked}.sif"
    context = {
        "d": env,
        "header": HEADER,
        "bootstrap": bootstrap,
        "source": source,
        "from_word": from_word(source),
        "labels": labels(env, source, digest),
        "environment": environment(env),
        "venv_bin": f"{VENV}/bin",
        "test_command": smoke_command(),
        # where the Dockerfile copies the launch script: beside preflight.py
        "run_command": RUN_SCRIPT_PATH,
        "preflight": PREFLIGHT,
        "sif": sif,
        "def_name": def_name,
    }
    return jinja_env().get_template(TEMPLATE).render(context)


def ours(path: Path) -> bool:
    """Whether `path` is a file this command wrote (its first line is HEADER)."""
    from envbuilder.limits import open_regular

    try:
        with open_regular(path, follow=False) as f:
            first = f.read(len(HEADER.encode()) + 1)
    except (OSError, ValueError):
        return False
    return first.startswith(HEADER.encode() + b" ")


def write_definition(
    m: Matrix,
    profile: str,
    overrides: Overrides | None,
    *,
    image: str | None = None,
    oci_archive: str | Path | None = None,
    out: str | Path | None = None,
    mirror: str | None = None,
    force: bool = False,
    say: Callable[[str], object] = print,
) -> Path:
    """`envbuild apptainer`: the definition of `profile`'s image written to `out` (default
    ./PROFILE.def), starting from `image` (REF@sha256:DIGEST) or `oci_archive` (exactly one),
    with `mirror`'s endpoints in %environment; notes go to `say`. Returns the file written."""
    from envbuilder.context.prepare import prepare
    from envbuilder.model import mirrors as M
    from envbuilder.model.resolve import resolve
    from envbuilder.render.outdir import write_owned_file
    from envbuilder.render.outdir import folder_name

    # (as typed: Path('') would be '.', the current folder)
    for option, value in (("-o", out), ("--oci-archive", oci_archive)):
        if value is not None and not str(value):
            raise UserError(
                f"{option} is empty: give a file name"
                + (" (e.g. PROFILE.def)." if option == "-o" else " (the .tar `envbuild export-image` wrote).")
            )
    out_path = Path(out) if out is not None else None
    archive = Path(oci_archive) if oci_archive is not None else None
    if bool(image) == bool(archive):
        raise UserError(
            "Pass the image to start from: --image REF@sha256:DIGEST (what `envbuild "
            "build PROFILE --push REGISTRY` printed) or --oci-archive PATH (not both)."
        )
    digest: str | None
    if image:
        source, digest = image_reference(image)
        bootstrap = "docker"
    else:
        assert archive is not None  # (exactly one of the two, checked above)
        bootstrap = "oci-archive"
        full = archive_path(archive)
        digest = archive_digest(full)
        source = str(full)
        if not full.exists():
            say(f"note: {full} does not exist yet; `apptainer build` needs it there.")
    env = M.split_credentials(resolve(m, profile, overrides))[0]  # (no user:password@ in it)
    # the mirror set's endpoints join it where they join every environment (context.prepare)
    choice = M.choice(mirror, M.get_set(m, mirror)) if mirror else None
    env = prepare(env, mirror=choice).env
    # (a card on another profile's stack: named for the card, as `envbuild build CARD` names its image)
    name = env.asked
    path = out_path if out_path is not None else Path(f"{folder_name(name, 'The profile name')}.def")
    if path.is_dir():  # (checked again by write_owned_file; here to name the file it wants)
        raise UserError(
            f"{path} is a folder; -o names the definition file to write (e.g. {path / (name + '.def')})."
        )
    if image and not re.search(rf"(^|/){re.escape(name)}(:[^/@]*)?@", source):
        say(
            f"note: {source} is not named after {name if env.card else 'profile ' + name}; the labels "
            f"and %environment describe {name} as resolved here. Check it is that image."
        )
    text = definition(env, source, bootstrap, digest, path.name)
    mark = f"its first line is not {HEADER!r}..."
    write_owned_file(path, text, ours, force=force, what="definition file", mark=mark)
    sif = f"{path.stem}.sif"
    say(f"wrote {path}: build it with `apptainer build {sif} {path}`, run it with `apptainer run --nv {sif}`")
    return path
