"""`envbuild wheelhouse`: export a lock's files for offline installs (requests loads lazily)."""

from __future__ import annotations

from pathlib import Path

import click

from envbuilder.cli.options import load_matrix, matrix_dir_option
from envbuilder.paths import LOCK_ROOT
from envbuilder.errors import UserError
from envbuilder.oci.http import no_empty_url


def url_map_for_mirror(body: dict) -> list[tuple[str, str]]:
    """Prefix rewrites that send a lock's upstream URLs through a mirror set's endpoints."""
    out = []
    for endpoint in body.get("pytorch") or []:
        if "{variant}" in endpoint:
            out.append(("https://download.pytorch.org/whl/", endpoint.split("{variant}")[0]))
    for endpoint in body.get("pypi") or []:
        if endpoint.rstrip("/").endswith("/simple"):  # PEP 503 mirrors keep PyPI's /packages/ paths
            out.append(("https://files.pythonhosted.org/packages/",
                        endpoint.rstrip("/")[: -len("simple")] + "packages/"))
    for endpoint in body.get("github") or []:  # GitHub files (apex archive, flash-attn wheels)
        out.append(("https://github.com/", endpoint.rstrip("/") + "/"))
    for channel, endpoints in (body.get("conda") or {}).items():
        for endpoint in endpoints:
            out.append((f"https://conda.anaconda.org/{channel}/", endpoint.rstrip("/") + "/"))
    return [(a, b) for a, b in out if a != b]


def _url_maps(values: tuple[str, ...]) -> list[tuple[str, str]]:
    out = []
    for v in values:
        frm, sep, to = v.partition("=")
        if not sep or not frm or not to:
            raise UserError(f"--url-map {v!r} is not FROM=TO (two URL prefixes).")
        out.append((frm, to))
    return out


def shipped_or_local_lock(profile: str) -> Path:
    """Where `render` finds a profile's lock: ./lockfiles/<profile>, else the one shipped with
    envbuild (plan.lock_candidates); the local path when neither exists (its error names it)."""
    from envbuilder.render.plan import lock_candidates

    candidates = lock_candidates(profile)
    return next((d for _, d in candidates if (d / "lock.json").is_file()), candidates[0][1])


def lock_shortfalls(m, profile: str, lock_dir: Path, accept_pypi_torch: bool,
                    accept_partial: bool) -> list[str]:
    """Why exporting this lock would carry something other than what the profile installs: a
    torch swapped for PyPI's build (what that means: its CUDA and driver floor), a part the
    profile needs and the lock lacks. Empty when nothing is short, or the user accepted it."""
    from envbuilder.lock.lockfile import parts_for, read_meta
    from envbuilder.model.resolve import resolve

    try:
        meta = read_meta(Path(lock_dir))  # (the one reader of lock.json)
    except (OSError, ValueError, UserError):
        return []  # no readable lock: export's own check names it
    if not isinstance(meta, dict):
        return []
    import re

    from envbuilder.render.plan import plan_sha256

    out = []
    swapped = meta.get("torch_swapped")
    if swapped and not accept_pypi_torch:
        asked = re.match(r"([0-9][0-9.]*)\+(cu\d+)", str(swapped))
        t = m.torch.get(asked.group(1)) if asked else None
        mine = (t or {}).get("builds", {}).get(asked.group(2)) if asked else None
        pypi = (t or {}).get("builds", {}).get((t or {}).get("pypi_default") or "")
        what = ""
        if mine and pypi and pypi["cuda"] in m.cuda:
            c = m.cuda[pypi["cuda"]]
            what = (f" PyPI's torch {asked.group(1)} is its CUDA {pypi['cuda']} build (the "
                    f"nvidia-*-cu{pypi['cuda'].split('.')[0]} runtime; driver >= "
                    f"{c.get('compat_driver') or c['min_driver']}), not the {asked.group(2)} build "
                    f"for CUDA {mine['cuda']} that {profile} is made for.")
        out.append(f"{lock_dir}: torch is a swap ({swapped}): the PyTorch index was out of reach "
                   f"when it was locked.{what} Fix: re-lock where the PyTorch index or its mirror "
                   f"answers (`envbuild lock {profile} --torch-index-url URL`, or --mirror NAME), "
                   "or pass --accept-pypi-torch to export it as it is.")
    if profile not in m.profiles:
        return out
    env = resolve(m, profile)
    if meta.get("plan_sha256") != plan_sha256(env):
        return out  # a lock of a variant (lock --without apex ...): its parts are its own
    missing = [p for p in parts_for(env, ("conda", "sources")) if p not in meta.get("parts", [])]
    if missing and not accept_partial:
        names = {"conda": "conda part (conda-lock.yml)",
                 "sources": "source archive of " + " or ".join(
                     n for n in ("apex", "flash-attn") if getattr(env, n.replace("-", "_")))}
        reach = {"conda": "the conda channels (or --channel a mirror)",
                 "sources": "GitHub (or --github-url a mirror)"}
        out.append(f"{lock_dir}: no {' and no '.join(names[p] for p in missing)}: it was made with "
                   f"--only {','.join(meta.get('parts', []))}, so the far side would have to "
                   f"fetch {'them' if len(missing) > 1 else 'it'}. Fix: `envbuild lock {profile}` "
                   f"where {' and '.join(reach[p] for p in missing)} can be reached, or pass "
                   "--accept-partial.")
    return out


@click.command()
@click.argument("profiles", nargs=-1, required=True)
@click.option("-o", "--out", type=click.Path(path_type=Path), required=True,
              help="Wheelhouse directory; several profiles exported into one share their files.")
@click.option("--lock-dir", type=click.Path(path_type=Path),
              help="The lock to export: DIR/<profile>/ as `envbuild lock -o DIR` writes it, or DIR "
                   "itself when it is the lock (default lockfiles/<profile>); one profile only.")
@click.option("--mirror", help="Try this mirror set's endpoints before the lock's own URLs.")
@click.option("--url-map", multiple=True, metavar="FROM=TO",
              help="Try URL prefix TO before FROM (repeatable), e.g. an internal artifact proxy.")
@click.option("--build-index-url", metavar="URL", envvar="ENVBUILD_BUILD_INDEX_URL",
              callback=no_empty_url,
              help="Index to fetch build backends (setuptools, ...) from when a lock's sdist is "
                   "built into a wheel (default: --mirror's PyPI endpoint, else the index the "
                   "lock was made from).")
@click.option("-j", "--jobs", default=8, show_default=True, help="Parallel downloads.")
@click.option("--tar", "make_tar", is_flag=True, help="Also pack OUT into OUT.tar to carry across.")
@click.option("--accept-pypi-torch", is_flag=True, help="Export a lock solved with PyPI's torch "
              "in place of the profile's +cuXXX build (the PyTorch index was out of reach when it "
              "was made), knowing the wheelhouse then carries PyPI's torch and its CUDA.")
@click.option("--accept-partial", is_flag=True, help="Export a lock that lacks a part the "
              "profile needs (the conda part, apex's or flash-attn's source), knowing the far "
              "side must fetch it.")
@matrix_dir_option
def wheelhouse(profiles, out, lock_dir, mirror, url_map, build_index_url, jobs, make_tar,
               accept_pypi_torch, accept_partial, matrix_dirs):
    """Fetch every file PROFILE's lock pins (wheels, conda packages), verified, for offline installs.

    Every sdist the lock pins is built into a wheel for the lock's target here, so the far side
    builds nothing."""
    from envbuilder.errors import need_extra
    from envbuilder.offline.wheelhouse import export

    need_extra("wheelhouse", "actions", ("requests",))
    if lock_dir and len(profiles) > 1:
        raise UserError("--lock-dir names one lock; export several profiles from lockfiles/<profile>.")
    if jobs < 1:
        raise UserError("--jobs must be at least 1.")
    if build_index_url and not build_index_url.startswith(("http://", "https://", "file://")):
        raise UserError(f"--build-index-url {build_index_url!r} is not an index URL; pass the "
                        "http(s):// or file:// URL of a PEP 503 index that serves the build "
                        "backends (e.g. https://pypi.org/simple or your mirror's).")
    maps = _url_maps(url_map)
    if mirror:
        from envbuilder.model import mirrors as M

        body = M.get_set(load_matrix(matrix_dirs), mirror)
        maps += url_map_for_mirror(body)
        build_index_url = build_index_url or next(iter(body.get("pypi") or []), None)
    if not lock_dir:  # a name without a lock is most often a typo of a profile
        m = load_matrix(matrix_dirs)
        for p in profiles:
            if p not in m.profiles and not (LOCK_ROOT / p).is_dir():
                from envbuilder.model.resolve import suggest

                raise UserError(f"Unknown profile {p!r}; {suggest(p, list(m.profiles))}known: "
                                f"{', '.join(m.profiles)}. Or pass --lock-dir for a lock elsewhere.")
    from envbuilder.lock.lockfile import lock_dir_in

    # --lock-dir DIR: DIR/<profile>/ as `lock -o DIR` wrote it, or DIR itself when it is the lock
    locks = {p: (lock_dir_in(lock_dir, p) if lock_dir else shipped_or_local_lock(p))
             for p in profiles}
    refusals = [why for p, d in locks.items()
                for why in lock_shortfalls(load_matrix(matrix_dirs), p, d, accept_pypi_torch,
                                           accept_partial)]
    if refusals:
        raise UserError("Not exported: the wheelhouse would not hold what the profile installs.\n"
                        + "\n".join(f"  - {r}" for r in refusals))
    from envbuilder.model.resolve import uv_pin

    # the uv wheel the Dockerfiles' runtime stage installs with (the matrix's pin), carried too
    uv = uv_pin(load_matrix(matrix_dirs).defaults or {})
    report = export(locks, out, url_map=maps, jobs=jobs, build_index=build_index_url,
                    say=lambda s: click.echo(s, err=True), tar=make_tar, uv=uv)
    click.echo(f"wheelhouse {out}/: {report.files} file(s), {len(report.downloaded)} downloaded "
               f"({report.bytes_transferred / 1e6:.1f} MB), {len(report.skipped)} already there, "
               f"{len(report.built)} wheel(s) built from sdists")
    if report.tar:
        click.echo(f"packed {report.tar}")
