"""ResolvedEnv -> files. Only formatting: every decision was made by the resolver.

Output is byte-identical for identical input (sorted, no timestamps). It is staged first and
moved into place file by file (outdir.py): a failed render changes nothing, and a re-render
replaces or deletes only the files envbuild wrote there and nobody edited since.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, TYPE_CHECKING

from envbuilder.paths import data_dir
from envbuilder import images
from envbuilder.render.dockerfile import FLASH_ATTN_SCRIPT, dockerfile_plan
from envbuilder.render.steps import APEX, FLASH_ATTN, TRANSFORMER_ENGINE, by_hand, finish_command
from envbuilder.render.image import HOME as IMAGE_HOME
from envbuilder.render.image import PREFLIGHT, RUN_SCRIPT  # (where the image puts them)
from envbuilder.render.image import default_tag
from envbuilder.render.quoting import FILTERS, comment, word
from envbuilder.text import USERINFO
from envbuilder.record import plain
from envbuilder.model.resolve import TORCH_DTYPE
from envbuilder.model.resolved import ResolvedEnv

if TYPE_CHECKING:
    from collections.abc import Mapping

    import jinja2

    from envbuilder.render.outdir import Checked
    from envbuilder.render.context import BuildContext
# output file -> template; executables get mode 0755
FILES = {
    "Dockerfile": "Dockerfile.j2",
    "environment.yml": "environment.yml.j2",
    "requirements.txt": "requirements.txt.j2",
    "pixi.toml": "pixi.toml.j2",  # the same plan for pixi (render/pixi.py)
    RUN_SCRIPT: "run_ppo_gsm8k.sh.j2",
    "envbuild-secrets.sh": "envbuild-secrets.sh.j2",
    "README.md": "README.md.j2",  # what each file is and the commands that come next
    # the image built by Apptainer alone, from the CUDA base image (render/sif.py)
    "apptainer.def": "apptainer-base.def.j2",
}
# the scripts that run in the image, copied byte for byte from envbuilder/images/, and the one
# file of the profile's data they read (SIDECAR, beside them)
SCRIPTS = tuple(images.SCRIPTS)
SIDECAR = images.SIDECAR
EXECUTABLE = {RUN_SCRIPT, *SCRIPTS}
MARKER = "envbuild.json"
SBOM = "sbom.cdx.json"  # a locked render's CycloneDX SBOM (lock/sbom.py builds it)

_jinja: jinja2.Environment | None = None


def smoke_command(preflight: str = PREFLIGHT) -> list[str]:
    """The image's own preflight.py in --smoke mode: the torch build and every module of the
    training path (its sidecar data's training_path, rendered from the same resolved environment),
    with no GPU needed. Its report goes to stderr, where docker's error carries it on failure."""
    return [
        "python",
        "-c",
        "import runpy, sys; sys.stdout = sys.stderr; path = sys.argv[1]; "
        "sys.argv = [path, '--smoke']; runpy.run_path(path, run_name='__main__')",
        preflight,
    ]


def _sealed_bytecode_cache() -> type[jinja2.BytecodeCache]:
    import base64

    import jinja2

    from envbuilder.paths import cache_file, read_sealed, write_sealed

    class SealedBytecodeCache(jinja2.BytecodeCache):
        """Jinja's compiled templates as sealed cache entries: opened through the private cache
        folder's descriptor, used only when their HMAC is this user's key's, none at all under
        ENVBUILD_NO_CACHE (read_sealed, write_sealed)."""

        def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            text = read_sealed(cache_file(f"jinja-{bucket.key}.json"))
            if text is not None:
                try:
                    bucket.bytecode_from_string(base64.b64decode(text, validate=True))
                except (ValueError, EOFError, TypeError):
                    bucket.reset()

        def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            body = base64.b64encode(bucket.bytecode_to_string()).decode("ascii")
            write_sealed(cache_file(f"jinja-{bucket.key}.json"), body)

    return SealedBytecodeCache


def jinja_env() -> jinja2.Environment:
    global _jinja
    if _jinja is None:
        import jinja2

        # compiled templates are code (marshal): kept only as sealed cache entries (paths.py), read
        # back only when this user's envbuild sealed them, never by a path someone could swap
        cache = _sealed_bytecode_cache()()
        _jinja = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            keep_trailing_newline=True,
            bytecode_cache=cache,
        )
        # every value leaves through the filter of the language it lands in (quoting.py)
        _jinja.filters.update(FILTERS)
        # tojson writes the resolved environment's records and read-only maps as plain JSON
        _jinja.policies["json.dumps_kwargs"] = {"sort_keys": True, "default": plain}
    return _jinja


def preflight_expectations(env: ResolvedEnv) -> dict[str, Any]:
    """What preflight.py checks, as data (its part of the sidecar). training_path: every module a
    training run imports, which the build's smoke test (preflight.py --smoke) imports too."""
    return {
        "profile": env.profile,
        "gpu": env.gpu.name,
        "compute_capability": env.gpu.compute_capability,
        "torch_version": env.torch.version,
        "torch_cuda": env.torch.cuda,
        "torch_requirement": env.torch.packages[0],
        "torch_index": env.torch.index_url or env.indexes.pypi,
        "dtype": env.dtype,
        "torch_dtype": TORCH_DTYPE[env.dtype],
        "torch_compile": env.features.torch_compile,
        "model_vram_gb": env.train.model_vram_gb,
        "min_driver": env.driver.min_driver,
        "compat_driver": env.driver.compat_driver,
        "driver_cuda": env.driver.for_cuda,
        "compat_libcuda": env.cuda.compat_libcuda,
        "training_path": list(env.training_path),
        # the run's extra Hydra overrides (run_ppo_gsm8k.sh passes them with --overrides)
        "verl_version": env.verl.version,
        "config_reads": list(env.verl.config_reads),
        "refused_overrides": [r.to_dict() for r in env.verl.refused_overrides],
        # apply_patches.py's replacements, to tell a patched verl from an unpatched one without
        # importing it, and the one command that patches and audits it
        "patches": [
            {"name": p.name, "files": list(p.files), "replace": [[r["find"], r["with"]] for r in p.replace]}
            for p in env.patches
        ],
        "finish": finish_command(env),
        # compiled from source in the image's builder stage, never in requirements.txt: how to
        # build each by hand (the Dockerfile's and apptainer.def's own spelling of the build)
        "built": {
            "apex": by_hand(env).get(APEX),
            "flash_attn": by_hand(env).get(FLASH_ATTN),
        },
    }


def audit_plan(env: ResolvedEnv) -> dict[str, Any]:
    """What audit_precision.py checks, as data (its part of the sidecar): the checks that apply, in the
    verl files the run loads (the training path's verl modules and the files the patches touch),
    with the matrix's reviewed exceptions."""
    no_bf16 = f"the profile computes in {env.dtype}" + (
        "" if env.gpu.bf16 else f"; the {env.gpu.name} has no native bfloat16"
    )
    return {
        "profile": env.profile,
        "gpu": env.gpu.name,
        "verl": env.verl.version,
        "checks": list(env.audit.checks),
        "reasons": {
            "autocast_bf16": no_bf16,
            "flash_attention_2": f"the attention is {env.attention}, not flash-attn",
        },
        "modules": [m for m in env.training_path if m.split(".")[0] == "verl"],
        "files": sorted({f for p in env.patches for f in p.files}),
        "reviewed": [
            {k: getattr(r, k) for k in ("name", "check", "file", "line", "why")} for r in env.audit.reviewed
        ],
    }


def patches_data(env: ResolvedEnv) -> dict[str, Any]:
    """What apply_patches.py applies, as data: each recorded patch (matrices/patches.yaml) with
    why, its files and its (find, with) replacements."""
    return {
        "profile": env.profile,
        "gpu": env.gpu.name,
        "verl": env.verl.version,
        "patches": [
            {
                "name": p.name,
                "why": p.why,
                "files": list(p.files),
                "replace": [[r["find"], r["with"]] for r in p.replace],
            }
            for p in env.patches
        ],
    }


def script_data(env: ResolvedEnv) -> dict[str, Any]:
    """The sidecar's content (SIDECAR): each rendered script's data under its key (images.SCRIPTS),
    for the scripts this profile has (no patches: no apply_patches; no dataset: no prepare_gsm8k)."""
    out: dict[str, Any] = {"preflight": preflight_expectations(env), "audit_precision": audit_plan(env)}
    if env.patches:
        out["apply_patches"] = patches_data(env)
    if env.dataset:
        out["prepare_gsm8k"] = {"profile": env.profile, **plain(env.dataset)}
    return out


def sidecar_text(data: dict[str, Any]) -> str:
    """The sidecar as written: sorted, indented, one trailing newline (the same bytes every time)."""
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def render_files(ctx: BuildContext) -> dict[str, str]:
    """All rendered files of a prepared environment (context.prepare; BuildContext.of for one
    rendered as it is) by name, in memory: what `ctx.env` prints. Its `locked` context
    (lock.lockfile.for_render) pins the base images by digest and installs each layer from its
    hashed requirement file; its `constraints` (the lock's pins context.prepare found, None
    where none fits) pin the plan's layers and are envbuild.json's `constraints`."""
    from envbuilder.render import pixi, sif
    from envbuilder.render.plan import install_plan, lock_hint, override_flags

    env, locked, constraints = ctx.env, ctx.locked, ctx.constraints
    if not env.run:  # (an environment a caller built without its run plan: derived, as resolve does)
        from envbuilder.model import runplan

        env = env._replace(run=runplan.build(env))
    # (with the pins the plan takes, where envbuild.json records them; `render --from` reads
    # them back into its context: runplan.saved_from_json)
    d = env.saved_dict(constraints)
    # A URL's user:password@ (an overlay's index, a --from file's endpoint) is a secret: no file
    # written here names it, envbuild.json included; `envbuild build` hands the ones the RUN
    # steps read to the build as the `endpoints` BuildKit secret (mirrors.split_credentials).
    credentials: list[str] = []
    compact = json.dumps(d, sort_keys=True, separators=(",", ":"))
    # (the compact form matches wherever the spaced one does, inside one string; a match
    # across two strings of the compact form is not one: the spaced form says)
    if USERINFO.search(compact) and USERINFO.search(json.dumps(d)):
        from envbuilder.model.mirrors import split_credentials

        env, d, secret = split_credentials(env, d)
        credentials = sorted(secret)
        compact = json.dumps(d, sort_keys=True, separators=(",", ":"))
    spec = env.to_json(d, compact)
    spec_sha256 = hashlib.sha256(spec.encode()).hexdigest()
    plan = install_plan(env, constraints)
    context = {
        "env": env,
        "plan": plan,
        "docker": dockerfile_plan(env, plan, locked, credentials, spec_sha256),
        "run_script": RUN_SCRIPT,
        "image_home": IMAGE_HOME,
        "spec_sha256": spec_sha256,
        "apex_command": by_hand(env).get(APEX, ""),
        "flash_attn_command": by_hand(env).get(FLASH_ATTN, ""),
        "te_command": by_hand(env).get(TRANSFORMER_ENGINE, ""),
        "locked": locked,
        "image_tag": default_tag(env, d),
        "lock_hint": lock_hint(env.profile, env.overrides),
        "override_flags": override_flags(env.overrides),
        "credentials": credentials,
        "pixi": pixi.context(env, plan, RUN_SCRIPT),
        "finish_command": finish_command(env),
        "sif": sif.context(env, plan, RUN_SCRIPT),
    }
    j = jinja_env()
    out = {MARKER: spec}
    for name, template in FILES.items():
        out[name] = j.get_template(template).render(context)
    data = script_data(env)
    out.update({name: images.script_text(name) for name, key in images.SCRIPTS.items() if key in data})
    out[SIDECAR] = sidecar_text(data)
    if env.flash_attn:
        from envbuilder.images import (
            flash_attn_wheel as flash_attn,
        )  # (the builder runs this module as the script)

        out[FLASH_ATTN_SCRIPT] = Path(flash_attn.__file__).read_text(encoding="utf-8")
    # each pip step's pins, one file per step (its cache key moves with it alone); a locked
    # Dockerfile installs the hashed files instead, requirements.txt and environment.yml these
    for layer in [*plan.layers, *([plan.builder] if plan.builder else [])]:
        head = (
            f"# envbuild: what the {layer.name} step of {env.profile} fixes for itself and "
            "every later step: "
            + (f"from {plan.pinned_from}" if plan.pinned_from else "its top-level pins only (no lock fits)")
            + (
                f"; solved with torch {plan.torch_swapped}, so torch's own packages are "
                "pinned by the requirements"
                if plan.torch_swapped
                else ""
            )
        )
        # (a pip constraints file: one comment line, then one bare pin a line; quoting.py)
        out[layer.constraints_file] = comment(head) + ".\n" + "".join(f"{word(pin)}\n" for pin in layer.pins)
    out.update(locked.files if locked else {})
    if locked and locked.sbom:  # (the Dockerfile copies it to /opt/envbuild/)
        out[SBOM] = locked.sbom
    return out


def write_dir(
    out_dir: Path,
    files: dict[str, str],
    links: Mapping[str, Checked] | None = None,
    force: bool = False,
    check_only: bool = False,
    option: str = "-o",
) -> list[Path]:
    """Write `files` (and hard-link `links`) into `out_dir`, replacing and deleting only what an
    earlier envbuild write put there (outdir.write_dir); the scripts get mode 0755.
    `check_only`: only refuse what the write would refuse."""
    from envbuilder.render.outdir import write_dir as write

    return write(out_dir, files, links, EXECUTABLE, force, check_only, option)


def render(ctx: BuildContext, out_dir: Path, force: bool = False) -> list[Path]:
    """The files of `ctx` written into `out_dir` (a wheelhouse's files linked there)."""
    return write_dir(out_dir, render_files(ctx), ctx.links, force=force)
