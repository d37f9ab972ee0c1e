"""`export-image`: a built image, read from the Docker engine (or, for a reference with a registry
host, from that registry), written as an OCI archive with its sidecar (engines/archive.py: the
archive's format, skopeo, the private work folder, publishing, the sidecar). It sits with the
engines because finding the image is the engine's question; oci/ knows nothing of engines.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from envbuilder.errors import ActionError, UserError
from envbuilder.engines.archive import (
    EXPORT_WORK,
    FORMAT,
    INNER,
    Say,
    Sidecar,
    Work,
    archive_name,
    check_reference,
    clean_debris,
    find_skopeo,
    fsync_path,
    has_registry,
    publish,
    read_index,
    run_skopeo,
    short,
    sidecar_path,
    skopeo_argv,
    skopeo_error,
)
from envbuilder.oci.registry import is_loopback
from envbuilder.tools.digest import sha256_file


def resolve_source(image: str, say: Say) -> tuple[str, list[str], str]:
    """(skopeo source, its flags, description) for `image`: the Docker engine's image when it
    has one by that name or ID, else the registry a reference with a host names. ActionError
    (exit 1) when neither has it."""
    from envbuilder.engines.docker import engine_image

    found, daemon_problem = engine_image(image)
    if found is not None:
        args = []
        host = os.environ.get("DOCKER_HOST")
        if host:
            args += ["--src-daemon-host", host]
        return (f"docker-daemon:{found.id}", args, f"{image} ({found.id[:19]}) from the Docker engine")
    if has_registry(image):
        from envbuilder.oci.registry import digest

        served = digest(image)  # ActionError (exit 1) with what the registry answered
        args = ["--src-tls-verify=false"] if is_loopback(image) else []
        pinned = image.split("@", 1)[0]
        if ":" in pinned.rsplit("/", 1)[-1]:
            pinned = pinned.rsplit(":", 1)[0]
        return (
            f"docker://{pinned}@{served.digest}",
            args,
            f"{image} ({served.digest[:19]}) from its registry",
        )
    if daemon_problem:
        raise ActionError(
            f"Cannot look up {short(image)}: {daemon_problem} (A reference with a "
            "registry host, HOST[:PORT]/NAME:TAG, is exported from that registry "
            "without the engine.)"
        )
    raise ActionError(
        f"No image {short(image)} in the Docker engine (`docker images` lists "
        "them), and the name has no registry host to fetch it from. Build it "
        "(envbuild build), check the name and tag, or give HOST[:PORT]/NAME:TAG "
        "(docker.io/NAME:TAG for Docker Hub)."
    )


def work_folder(out: Path) -> Work:
    """The private folder skopeo exports `out` in, beside it; absolute, since skopeo runs in it
    (with TMPDIR set to it) and a relative `-o p40.tar` named a folder skopeo could not find."""
    return Work(out.absolute().parent, f".{out.name[:40]}.envbuild-")


def export_image(image: str, out: Path | str, force: bool, say: Say) -> Sidecar:
    """Write `image` as an OCI archive at `out` and its sidecar next to it; returns the
    sidecar's data."""
    check_reference(image)
    if not str(out):
        raise UserError("-o is empty: give the archive's file name, e.g. image.tar.")
    out = Path(out)
    if out.is_dir() or out.name in ("", ".", ".."):
        raise UserError(f"-o {out} is a directory: give the archive's file name, e.g. {out / 'image.tar'}.")
    side = sidecar_path(out)
    if not out.parent.is_dir():
        raise UserError(f"-o {out}: the folder {out.parent} does not exist. Create it first.")
    if not force:
        for p in (out, side):
            if os.path.lexists(p):
                raise UserError(
                    f"{p} exists; export-image does not overwrite it. Remove it, pick "
                    "another -o, or pass --force."
                )
    skopeo = find_skopeo()
    clean_debris(out.parent, EXPORT_WORK)
    try:
        work = work_folder(out)
    except OSError as e:
        raise ActionError(
            f"Cannot write into {out.parent}: {e.strerror}. Check that folder's "
            "permissions and free space, or pick another -o; nothing was "
            "written."
        ) from None
    try:
        return _export_into(image, out, side, force, skopeo, work, say)
    except OSError as e:
        raise ActionError(
            f"Cannot write {out}: {e.strerror}. Check the free space and "
            f"permissions in {out.parent}, then run again; nothing was "
            "written."
        ) from None
    finally:
        work.close()


def _export_into(
    image: str, out: Path, side: Path, force: bool, skopeo: str, work: Work, say: Say
) -> Sidecar:
    source, src_args, described = resolve_source(image, say)
    say(f"exporting {described} to {out}")
    name = archive_name(image)
    dest = f"oci-archive:{INNER}" + (f":{name}" if name else "")
    rc, tail = run_skopeo(
        [*skopeo_argv(skopeo, work), "copy", *src_args, "--digestfile", "digest", source, dest],
        say,
        cwd=work.path,
        env={"TMPDIR": str(work.path)},
        work=work,
    )
    if rc != 0:
        raise ActionError(
            f"skopeo could not export {short(image)} (exit {rc}): "
            f"{skopeo_error(tail.splitlines()[-1] if tail else '')}. Check that "
            f"the engine or registry serves it, and the free space in "
            f"{out.parent}; nothing was written."
        )
    archive = work.path / INNER
    copied = (work.path / "digest").read_text().strip()
    info = read_index(archive)
    if info["digest"] != copied:
        raise ActionError(
            f"skopeo reported manifest {copied} but the archive holds "
            f"{info['digest']}; nothing was written. Run again."
        )
    fsync_path(archive)
    sha, size = sha256_file(archive)
    data: Sidecar = {
        "format": FORMAT,
        "image": image,
        "name": name,
        "source": source,
        "manifest_digest": info["digest"],
        "media_type": info["media_type"],
        "config_digest": info["config_digest"],
        "archive": out.name,
        "archive_sha256": sha,
        "archive_size": size,
    }
    (work.path / "sidecar").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    fsync_path(work.path / "sidecar")
    publish(archive, out, force)
    try:
        publish(work.path / "sidecar", side, force)
    except BaseException:
        out.unlink(missing_ok=True)  # ours, just linked: no archive without its sidecar
        raise
    fsync_path(out.parent)
    return data
