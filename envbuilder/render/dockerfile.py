"""The Dockerfile's part of the install plan: every step of every stage, decided and quoted here,
so templates/Dockerfile.j2 only prints them.

Decided here: the stages (a devel builder only when something is compiled), the install mode of
each pip step (unlocked within constraints/, locked with --require-hashes, offline from a
wheelhouse) and its installer (uv in the runtime stage, pip in the builder and where a
wheelhouse holds no uv wheel), which files each step bind-mounts, where the builder's wheels go
in, apex's build flags, flash-attn's wheel-or-sdist step, the labels and the ENV. Every value
goes through the filter of the place it lands (quoting.py) before it reaches the template.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from envbuilder.model.components import apex as APEX
from envbuilder.model.components import flash_attn as FA
from envbuilder import images
from envbuilder.record import Record, plain
from envbuilder.render import image as I
from envbuilder.render import steps as S
from envbuilder.render.plan import InstallPlan, Layer
from envbuilder.render.quoting import arg, comment, dq, sh

if TYPE_CHECKING:
    from collections.abc import Iterable

    from envbuilder.model.resolved import ResolvedEnv
    from envbuilder.render.locked import LockedContext

SECRETS = tuple(f"--mount=type=secret,id={s}" for s in ("ca_cert", "pip_conf", "endpoints"))
PROLOGUE = f". {I.SECRETS_SCRIPT} &&"  # (reads the secrets into the RUN step's environment)
PIP_CACHE, UV_CACHE = "/root/.cache/pip", "/root/.cache/uv"
FLASH_ATTN_SCRIPT = "flash_attn_wheel.py"  # copied, not rendered (files.py writes it)
# the runtime steps the builder's wheels go in before: the first of them that the plan has
WHEELS_BEFORE = ("verl-deps", "verl")
STEP_COMMENT = {
    "torch": "torch: the largest layer, first, so it stays cached.",
    "verl-deps": "verl's dependencies, pinned to versions that work together.",
    "verl": "verl itself: the cheapest layer, last.",
    "megatron": "verl's Megatron engine: megatron-core, mbridge and TransformerEngine's core wheel, within verl's pins.",
}


class Instruction(Record):
    """One Dockerfile instruction, ready to print, and the comment lines above it. comments:
    each line's text after `# `. keyword: FROM, ARG, ENV, RUN, COPY, LABEL, ... words: its
    arguments, each already quoted for where it lands, printed with a space between. lines:
    continuation lines (a RUN's shell, a LABEL's pairs), each printed after ` \\` and a line
    break, its own indentation included."""

    keyword: str
    words: tuple[str, ...]
    lines: tuple[str, ...] = ()
    comments: tuple[str, ...] = ()


class DockerfilePlan(Record):
    """What Dockerfile.j2 prints: `notes`, the header's comment lines after the two that name
    the profile, then `blocks` (the base-image ARGs, then each stage), a blank line before
    each."""

    notes: tuple[str, ...]
    blocks: tuple[tuple[Instruction, ...], ...]


def _i(keyword: str, *words: str, lines: Iterable[str] = (), comments: Iterable[str] = ()) -> Instruction:
    return Instruction(keyword, tuple(words), tuple(lines), tuple(comments))


def _cache(target: str) -> str:
    return f"--mount=type=cache,target={target}"


def _tojson(value: object) -> str:
    """JSON as the template's `tojson` wrote it: sorted keys, records as plain data, and <, >,
    & and ' as \\u escapes (jinja's htmlsafe_json_dumps)."""
    text = json.dumps(value, sort_keys=True, default=plain)
    for ch in "<>&'":
        text = text.replace(ch, f"\\u{ord(ch):04x}")
    return text


class _Steps:
    """The steps of one render: the environment, its plan and its `locked` context."""

    def __init__(self, env: ResolvedEnv, plan: InstallPlan, locked: LockedContext | None):
        self.env, self.plan, self.locked = env, plan, locked
        self.steps = S.install_steps(env, plan)
        self.wheelhouse = bool(locked and locked.wheelhouse)
        # uv installs the runtime stage, except from a wheelhouse exported without its wheel
        self.uv = not (self.wheelhouse and locked is not None and not locked.uv_wheel)

    # -- pieces of a RUN line

    def mounts(self, files: Iterable[str | None]) -> list[str]:
        """Bind mounts of build-context files (and the wheelhouse, when installing from one)."""
        out = [f"--mount=type=bind,source={f},target={I.CONTEXT}/{f}" for f in files if f]
        if self.wheelhouse:
            out.append(f"--mount=type=bind,source=wheelhouse,target={I.WHEELHOUSE}")
        return out

    def step_files(self, layer: Layer, upto: Iterable[Layer]) -> list[str | None]:
        """What a pip step reads from the build context: its hashed file when locked, else the
        constraints files of the steps up to it that pin anything."""
        if self.locked:
            return [self.locked.layers.get(layer.name)]
        return [ly.constraints_file for ly in upto if ly.pins]

    def index(self, uv: bool) -> str:
        """The index options of a step: uv reads neither pip.conf nor PIP_INDEX_URL, so each uv
        step names its indexes (the endpoints secret may have replaced them with a mirror's)."""
        if self.env.indexes.torch:
            return '--index-url "${TORCH_INDEX_URL}" --extra-index-url "${PIP_INDEX_URL}" ' + (
                "--index-strategy unsafe-best-match " if uv else ""
            )
        return '--index-url "${PIP_INDEX_URL}" ' if uv else ""

    def install(self, layer: Layer, upto: Iterable[Layer], uv: bool = False) -> str:
        """The pip (or uv) command of one step: from the lock's hashed file (from the
        wheelhouse: no index at all), or within the constraints of the steps up to it."""
        installer = "uv pip install" if uv else "pip install"
        if self.locked:
            target = f"-r {I.CONTEXT}/{self.locked.layers[layer.name]}"
            if self.wheelhouse:
                return (
                    f"{installer} --no-index --find-links {I.WHEELHOUSE} --no-deps --require-hashes {target}"
                )
            return f"{installer} --no-deps --require-hashes {self.index(uv)}{target}"
        constraints = "".join(f"-c {I.CONTEXT}/{ly.constraints_file} " for ly in upto if ly.pins)
        if layer.arg:  # its version a build ARG (ARG VERL_VERSION) can override
            name, _, _version = layer.requirements[0].partition("==")
            wanted = f'"{name}==${{{layer.arg}}}"'
        else:
            wanted = " ".join(sh(r) for r in layer.requirements)
        return f"{installer} {self.index(uv)}{constraints}{wanted}"

    def run(
        self,
        cache: str,
        mounts: list[str],
        shell: list[str],
        secrets: bool = True,
        comments: Iterable[str] = (),
    ) -> Instruction:
        """A RUN with a cache mount at `cache`, `mounts` and (`secrets`) the secrets the
        prologue reads; `shell`: its lines, the first after the prologue."""
        first, *rest = shell
        words = [_cache(cache), *mounts, *(SECRETS if secrets else ())]
        return _i(
            "RUN",
            *words,
            lines=[f"    {PROLOGUE} {first}" if secrets else f"    {first}", *rest],
            comments=comments,
        )

    # -- the parts of the file

    def notes(self, credentials: list[str]) -> list[str]:
        env, plan, locked = self.env, self.plan, self.locked
        out: list[str] = []
        if locked:
            out.append(
                "Locked: "
                + ("base images by digest, " if locked.images_pinned else "")
                + f"every pip layer with --require-hashes (lock input sha256 {locked.input_sha256})."
            )
            if self.wheelhouse:
                out.append(
                    "Offline: pip and uv install only from the wheelhouse in the build context (--no-index)."
                )
        out.append(
            "Build: docker buildx build --network=host [--secret id=ca_cert,src=ca.pem] [--secret "
            "id=pip_conf,src=pip.conf] [--secret id=endpoints,src=FILE (a mirror's credentials)] -t IMAGE ."
        )
        if credentials:
            out.append(
                f"Credentials: {', '.join(credentials)} {'is' if len(credentials) == 1 else 'are'} written "
                "here without user:password@; `envbuild build` passes them to the RUN steps as the "
                "endpoints secret (by hand: --secret id=endpoints,src=FILE of `export VAR='URL'` lines)."
            )
        if env.mirror:
            out.append(
                f"Mirror set {comment(env.mirror.name)}: images, indexes and endpoints below point at it."
            )
        out += [f"WARNING (--allow-unsupported): {comment(w)}" for w in env.warnings]
        if not locked and plan.pinned_from:
            swapped = (
                f" (solved with torch {comment(plan.torch_swapped)}; torch's own packages come from "
                "the top-level pins)"
                if plan.torch_swapped
                else ""
            )
            out.append(
                "Every pip step installs within constraints/ (its step's and the earlier steps'): the "
                f"whole set from {comment(plan.pinned_from)}{swapped}."
            )
        elif not locked:
            out.append(
                "NOT PINNED beyond the top-level pins (constraints/): no lock matches this "
                "environment, so dependencies float."
            )
            out.append(
                f"`envbuild lock {comment(env.profile)}` (same overrides) makes one; render again to use it."
            )
        return out

    def base_args(self) -> list[Instruction]:
        images = self.locked.images if self.locked else self.env.cuda.images
        out = [_i("ARG", f"BASE_RUNTIME={arg(images['runtime'])}")]
        if self.plan.builder:
            out.append(_i("ARG", f"BASE_DEVEL={arg(images['devel'])}"))
        return out

    def setup(self) -> list[Instruction]:
        """What each stage starts with: the index ARGs, the ENV, bash, the secrets script, and
        the image's Python (from apt only where the base image lacks it) with the venv."""
        env = self.env
        out = [_i("ARG", f"PIP_INDEX_URL={arg(env.indexes.pypi)}")]
        if env.indexes.torch:
            out.append(_i("ARG", f"TORCH_INDEX_URL={arg(env.indexes.torch)}"))
        apt = (env.mirror.apt if env.mirror else "") or ""
        out.append(_i("ARG", f'APT_MIRROR="{dq(apt)}"'))
        pairs = [f"{k}={v}" for k, v in I.STAGE_ENV]
        out.append(_i("ENV", *pairs[:3], lines=["    " + " ".join(pairs[3:])]))  # (the venv's own line)
        out.append(_i("SHELL", '["/bin/bash", "-o", "pipefail", "-c"]'))
        out.append(
            _i(
                "COPY",
                "envbuild-secrets.sh",
                I.SECRETS_SCRIPT,
                comments=[
                    "A CA bundle / pip.conf reach RUN steps as BuildKit secrets only: never written into a layer."
                ],
            )
        )
        message = (
            f"but {env.profile}'s pins and wheels are for Python {env.python}: build with the profile's "
            f"own base images (the defaults of the BASE_ build args, CUDA {env.cuda.version}), or render "
            f"for this base: envbuild render {env.asked} --python X.Y with a --cuda whose image ships it"
        )
        shell = [
            "if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then",
            '      if [ -n "$APT_MIRROR" ]; then',
            '        sed -i "s#http://archive.ubuntu.com/ubuntu#${APT_MIRROR}#g; '
            's#http://security.ubuntu.com/ubuntu#${APT_MIRROR}#g" /etc/apt/sources.list '
            "/etc/apt/sources.list.d/*.sources 2>/dev/null;",
            "        rm -f /etc/apt/sources.list.d/cuda*.list;",
            "      fi;",
            "      apt-get $APT_CA_OPT update && apt-get $APT_CA_OPT install -y --no-install-recommends "
            "python3 python3-venv python3-pip python3-dev ca-certificates;",
            "    fi",
            f"    && python3 -m venv {I.VENV}",
            f'    && base_python="$({I.VENV}/bin/python -c \'import sys; print("%d.%d" % sys.version_info[:2])\')"',
            f'    && if [ "$base_python" != {sh(env.python)} ]; then',
            f'      echo "envbuild: the base image\'s python3 is Python ${{base_python}}," {sh(message)} >&2;',
            "      exit 1;",
            "    fi",
        ]
        # (One `sharing=locked` cache mount per step, the step's last cache mount, which
        # serializes the step: buildah before 1.29 releases only the last cache mount's lock,
        # so /var/lib/apt is shared behind it.)
        out.append(
            self.run(
                "/var/lib/apt,sharing=shared",
                [_cache("/var/cache/apt,sharing=locked")],
                shell,
                comments=[
                    f"Python {env.python}: the image's own; installed from apt only when the base image "
                    "lacks it. A base",
                    f"image whose python3 is another version is refused here: the pins and wheels are for "
                    f"{env.python}.",
                ],
            )
        )
        return out

    def builder(self) -> list[Instruction]:
        """The builder stage: torch and the build tools with pip, then apex and flash-attn's
        wheels into /wheels."""
        env, plan, locked = self.env, self.plan, self.locked
        assert plan.builder is not None  # (called only for a plan with a builder stage)
        builder = plan.builder
        out = [
            _i(
                "FROM",
                "${BASE_DEVEL}",
                "AS",
                "builder",
                comments=["---- builder: compiles what has no prebuilt wheel for this GPU " + "-" * 31],
            ),
            *self.setup(),
        ]
        why = [
            "pip, not uv, in this stage: it builds wheels with `pip wheel` (apex; flash-attn's sdist "
            "fallback), which uv has no",
            "equivalent of, into the same environment its pip installed torch into.",
        ]
        torch = plan.layers[0]
        if locked:
            build = locked.layers.get("build")
            shell = [self.install(torch, ())] + ([f"    && {self.install(builder, ())}"] if build else [])
            files: list[str | None] = [locked.layers["torch"], build]
        else:  # the builder's torch within the torch step's pins too: the extensions build against it
            upto = (torch, builder)
            shell, files = [self.install(builder, upto)], self.step_files(builder, upto)
        out.append(self.run(PIP_CACHE, self.mounts(files), shell, comments=why))
        out.append(_i("ARG", "MAX_JOBS=4"))
        out.append(
            _i("ENV", f'TORCH_CUDA_ARCH_LIST="{dq(env.gpu.compute_capability)}"', "MAX_JOBS=${MAX_JOBS}")
        )
        for step in self.steps:
            if isinstance(step, S.Compile):
                out += {S.APEX: self.apex, S.TRANSFORMER_ENGINE: self.transformer_engine}.get(
                    step.component, self.flash_attn
                )()
        return out

    def transformer_engine(self) -> list[Instruction]:
        """TransformerEngine's PyTorch extension (model/components/transformer_engine.py), an
        sdist only: compiled for the card's arch into the builder's wheels."""
        from envbuilder.model.components import transformer_engine as TE

        source = self.locked.te_source if self.locked else None
        mounts: list[str] = []
        sdist = None
        if source and self.wheelhouse:  # (the lock's sdist from the wheelhouse, no index)
            sdist = (f"{I.WHEELHOUSE}/sources/{source['filename']}", str(source["sha256"]))
            mounts = [f"--mount=type=bind,source=wheelhouse,target={I.WHEELHOUSE}"]
        shell = TE.build_shell(self.env, I.WHEELS, "", sdist)
        shell = [shell[0], *("    " + line for line in shell[1:])]
        comments = [
            "TransformerEngine's PyTorch extension (verl's Megatron engine) has no wheel on PyPI: "
            "compiled against this torch,",
            "for this card's arch only, with the cuDNN headers of the nvidia-cudnn wheel torch installed.",
        ]
        return [self.run(PIP_CACHE, mounts or self.mounts([]), shell, comments=comments)]

    def apex(self) -> list[Instruction]:
        env = self.env
        assert env.apex is not None  # (called only for a profile with apex)
        source = self.locked.apex_source if self.locked else None
        comments = [
            f"apex: nvcc {env.cuda.version} == torch.version.cuda {env.torch.cuda}; no GPU is visible "
            "during the build, so the arch list is explicit."
        ]
        if source and self.wheelhouse:
            comments.append(f"The apex source comes from the wheelhouse (sha256 {source['sha256']}).")
            url = f"file://{I.WHEELHOUSE}/sources/{source['filename']}"
        else:
            url = env.apex.url
        requirement = '"apex @ ${APEX_URL}' + (f"#sha256={source['sha256']}" if source else "") + '"'
        command = APEX.shell_command(env.apex, f"pip wheel -v --no-deps -w {I.WHEELS}", requirement)
        mounts = (
            [f"--mount=type=bind,source=wheelhouse,target={I.WHEELHOUSE}"]
            if source and self.wheelhouse
            else []
        )
        return [_i("ARG", f"APEX_URL={arg(url)}", comments=comments), self.run(PIP_CACHE, mounts, [command])]

    def flash_attn(self) -> list[Instruction]:
        """flash-attn's step: its building block (model/components/flash_attn.py) says the
        lines of each way (an index wheel, the release wheel, a source build); here they become
        instructions, with the mounts and the lock's pins of this render."""
        env, fa = self.env, self.env.flash_attn
        assert fa is not None  # (called only for a profile with flash-attn)
        pins = self.locked.flash_attn_wheels if self.locked else None
        ccache = _cache(FA.CCACHE_DIR)
        script = f"--mount=type=bind,source={FLASH_ATTN_SCRIPT},target={I.CONTEXT}/{FLASH_ATTN_SCRIPT}"
        if fa.how == FA.INDEX and not pins:
            check = f"python {I.CONTEXT}/{FLASH_ATTN_SCRIPT}"
            return [
                _i("ARG", f"FLASH_ATTN_INDEX={arg(fa.index or '')}", comments=FA.comments(env)),
                self.run(PIP_CACHE, [ccache, script, *self.mounts([])], FA.index_shell(env, I.WHEELS, check)),
            ]
        if fa.how == FA.SOURCE and not pins:
            shell = FA.source_build_shell(env, I.WHEELS, "")
            shell = [shell[0], *("    " + line for line in shell[1:])]
            return [self.run(PIP_CACHE, [ccache, *self.mounts([])], shell, comments=FA.comments(env))]
        release = f"file://{I.WHEELHOUSE}/sources" if pins and self.wheelhouse else f'"{dq(fa.release)}"'
        shell = FA.release_shell(
            env,
            script=f"python {I.CONTEXT}/{FLASH_ATTN_SCRIPT}",
            wheels=I.WHEELS,
            cuda_tags=_tojson(fa.cuda_tags),
            pins=_tojson(pins) if pins else None,
            quote=sh,
        )
        comments = FA.release_comments(env, locked=bool(pins))
        return [
            _i("ARG", f"FLASH_ATTN_RELEASE={release}", comments=comments),
            self.run(PIP_CACHE, [script, *([] if pins else [ccache]), *self.mounts([])], shell),
        ]

    def runtime(self, spec_sha256: str) -> list[Instruction]:
        """The runtime stage: uv, each pip step from the most expensive, the builder's wheels
        before verl's, then envbuild's own files, the ENV and the labels."""
        env, plan, locked = self.env, self.plan, self.locked
        out = [
            _i("FROM", "${BASE_RUNTIME}", "AS", "runtime", comments=["---- runtime " + "-" * 81]),
            *self.setup(),
        ]
        pending: list[str] = []  # comment lines for the next instruction
        if self.uv:
            out.append(
                _i(
                    "ENV",
                    "UV_LINK_MODE=copy",
                    "UV_COMPILE_BYTECODE=1",
                    "UV_PYTHON_DOWNLOADS=never",
                    comments=[
                        f"uv {env.uv.version} installs this stage's packages (faster than pip); pip installs "
                        "uv itself first, checked by",
                        "sha256." + (" From the wheelhouse." if self.wheelhouse else "") + " uv reads no "
                        "pip.conf: each step below names its index.",
                    ],
                )
            )
            offline = f"--no-index --find-links {I.WHEELHOUSE} " if self.wheelhouse else ""
            uv_pin = sh(f"uv=={env.uv.version} --hash=sha256:{env.uv.sha256}")
            shell = f"pip install --no-deps --require-hashes {offline}-r <(echo {uv_pin})"
            out.append(self.run(PIP_CACHE, self.mounts([]), [shell]))
        else:
            pending.append(
                f"pip runs this stage's steps: the wheelhouse holds no uv {env.uv.version} wheel (`envbuild "
                "wheelhouse` takes it from the lock's index)."
            )
        cache = UV_CACHE if self.uv else PIP_CACHE
        wheels_before = next((ly.name for ly in plan.layers if ly.name in WHEELS_BEFORE), None)
        for step in self.steps:
            if isinstance(step, S.PipLayer):
                layer = step.layer
                if plan.builder and layer.name == wheels_before:
                    out.append(self.builder_wheels(cache, pending))
                    pending = []
                if locked and not locked.layers.get(layer.name):
                    continue  # (the lock installs nothing in this step)
                pending.append(self.step_comment(layer))
                if layer.arg:
                    _name, _, version = layer.requirements[0].partition("==")
                    out.append(_i("ARG", f"{layer.arg}={arg(version)}", comments=pending))
                    pending = []
                run = self.run(
                    cache,
                    self.mounts(self.step_files(layer, step.within)),
                    [self.install(layer, step.within, self.uv)],
                )
                out.append(run._replace(comments=tuple(pending)))
                pending = []
            elif isinstance(step, S.RunScript):
                out += self.copy_and_run(step.script, [*pending, self.script_comment(step.script)])
                pending = []
        out.append(_i("COPY", "envbuild.json", I.RECORD))
        if self.locked and self.locked.sbom:
            out.append(_i("COPY", "sbom.cdx.json", I.SBOM))
        scripts = ["preflight.py", I.RUN_SCRIPT, *(["prepare_gsm8k.py"] if env.dataset else [])]
        out.append(_i("COPY", *scripts, f"{I.HOME}/"))
        for name, value in I.runtime_env(env):
            if name == "HF_ENDPOINT":  # (a build ARG: a build can point it elsewhere)
                out.append(_i("ARG", f"HF_ENDPOINT={arg(value)}"))
                out.append(_i("ENV", "HF_ENDPOINT=${HF_ENDPOINT}"))
            elif name == "TORCHDYNAMO_DISABLE":
                below = f"CC {env.gpu.compute_capability} is below Triton's floor: torch.compile stays off."
                out.append(_i("ENV", f"{name}={value}", comments=[below]))
        out.append(self.label(spec_sha256))
        out.append(_i("WORKDIR", "/workspace"))
        out.append(_i("CMD", json.dumps(["python", I.PREFLIGHT])))
        return out

    def builder_wheels(self, cache: str, pending: list[str]) -> Instruction:
        """The builder's compiled wheels, installed before the first of WHEELS_BEFORE."""
        return self.run(
            cache,
            [f"--mount=type=bind,from=builder,source={I.WHEELS},target={I.WHEELS}"],
            [f"{'uv ' if self.uv else ''}pip install --no-deps {I.WHEELS}/*.whl"],
            secrets=False,
            comments=[
                *pending,
                "compiled extensions from the builder, bind-mounted so no build tree lands in a layer.",
            ],
        )

    def script_comment(self, script: str) -> str:
        if script == S.PATCHES:
            names = ", ".join(comment(p.name) for p in self.env.patches)
            return f"Recorded source patches ({names}); each must match or the build stops."
        checks = self.env.audit.checks
        return (
            "Precision audit: "
            + (
                f"no {' or '.join(checks)} left in the verl files the run loads, except reviewed lines"
                if checks
                else "nothing to check (bf16 and flash-attn)"
            )
            + "; a finding stops the build."
        )

    def step_comment(self, layer: Layer) -> str:
        if layer.name == "vllm":
            v = self.env.vllm
            assert v is not None
            return f"vLLM {v.version}: pins torch=={v.torch}, which is the torch above."
        if layer.name == "sglang":
            g = self.env.sglang
            assert g is not None
            return f"SGLang {g.version} and its kernels: pins torch=={g.torch}, which is the torch above."
        return STEP_COMMENT[layer.name]

    def copy_and_run(self, script: str, comments: Iterable[str]) -> list[Instruction]:
        """COPY the script with the data it reads (the sidecar beside it), then RUN it."""
        copy = _i("COPY", script, images.SIDECAR, f"{I.HOME}/", comments=comments)
        return [copy, _i("RUN", "python", f"{I.HOME}/{script}")]

    def label(self, spec_sha256: str) -> Instruction:
        env = self.env
        pairs = [
            ("org.opencontainers.image.title", f"envbuild {env.asked}"),
            ("org.opencontainers.image.description", env.described),
            *I.labels(env),
            (I.LABEL + "spec-sha256", spec_sha256),
        ]
        if self.locked:
            pairs.append((I.LABEL + "lock-input-sha256", self.locked.input_sha256))
            if self.locked.sbom:
                pairs.append((I.LABEL + "sbom-sha256", self.locked.sbom_sha256))
        first, *rest = [f'{k}="{dq(v)}"' for k, v in pairs]
        return _i("LABEL", first, lines=[f"      {p}" for p in rest])


def dockerfile_plan(
    env: ResolvedEnv,
    plan: InstallPlan,
    locked: LockedContext | None,
    credentials: Iterable[str] = (),
    spec_sha256: str = "",
) -> DockerfilePlan:
    """Every step of `env`'s Dockerfile (its install `plan`, `locked`: lock.lockfile.for_render
    or None; `credentials`: the endpoints written without their user:password@)."""
    s = _Steps(env, plan, locked)
    blocks = [tuple(s.base_args())]
    if plan.builder:
        blocks.append(tuple(s.builder()))
    blocks.append(tuple(s.runtime(spec_sha256)))
    return DockerfilePlan(tuple(s.notes(list(credentials))), tuple(blocks))
