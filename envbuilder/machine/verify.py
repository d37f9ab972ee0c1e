"""`envbuild verify`: the real-install tier. A profile's real pinned set goes into a throwaway
venv of the profile's Python, layer by layer in the Dockerfile's order, with `pip check` after
every layer; then the recorded source patches, an import of every module on the training path
(each in a fresh interpreter, no GPU, no network), and verl's own Hydra config composed with the
rendered run script's overrides (`--cfg job`: composed and printed, never run).

Nothing here decides compatibility: the env comes from the resolver, the files from the
renderer, the steps from `render/steps.py` (this module is their one executor, for verify and
install). Only stdlib at import time; uv runs as a
child process.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Mapping, Sequence

from envbuilder.errors import UserError
from envbuilder.images import patch_command
from envbuilder.record import Record
from envbuilder.secret import SecretUrl, secret
from envbuilder.tools.run import stop_group
from envbuilder.model.resolved import ResolvedEnv
from envbuilder.render.plan import layer_roots
from envbuilder.render.steps import PATCHES, TRANSFORMER_ENGINE, Compile, PipLayer, RunScript, Step, Venv
from envbuilder.machine.verify_report import (
    Audit,
    Compiled,
    Compose,
    ImportEntry,
    LayerEntry,
    Mismatch,
    NotInstalled,
    Patches,
    Validation,
    VerifyReport,
)

if TYPE_CHECKING:
    from envbuilder.render.context import BuildContext

# uv's own summary lines, forwarded as progress while a layer installs
_UV_PROGRESS = ("Resolved ", "Prepared ", "Installed ", "Uninstalled ", "Downloading ", "Building ", "Built ")
HEARTBEAT_S = 30.0
PROBE_TIMEOUT_S = 5.0
INSTALL_TIMEOUT_S = 3600.0
IMPORT_TIMEOUT_S = 600.0
# TransformerEngine's PyTorch extension, compiled by verify and install (11 min on 2 cores)
COMPILE_TIMEOUT_S = 3 * 3600.0
COMPOSE_TIMEOUT_S = 600.0
RESULT = "envbuild-verify-result: "

# One import in a fresh interpreter; the result is one marked JSON line, printed before os._exit
# so that a crash at interpreter exit (ray, vllm) cannot turn a clean import into a failure.
IMPORT_SNIPPET = f"""
import importlib, json, os, sys
name = sys.argv[1]
try:
    importlib.import_module(name)
except BaseException as e:
    text = f"{{type(e).__name__}}: {{e}}".strip().splitlines()
    res = {{"ok": False, "error": text[0] if text else type(e).__name__,
           "missing": e.name if isinstance(e, ModuleNotFoundError) else None}}
else:
    res = {{"ok": True}}
sys.stdout.write("\\n{RESULT}" + json.dumps(res) + "\\n")
sys.stdout.flush()
os._exit(0)
"""

# verl's own checks of a composed config, in the verify venv (verl imported as the trainer
# imports it): the overrides the run script passed, composed with the release's Hydra config as
# main_ppo composes them, then main_ppo's validate_config (verl >= 0.6: verl/utils/config.py, with
# need_reference_policy / need_critic), which builds the actor's, critic's and rollout's config
# dataclasses and calls their validate(). The resolved config comes back for envbuild's own
# arithmetic (envbuilder/model/batches.py: what the engine workers assert later, at run time).
VALIDATE_SNIPPET = f"""
import json, os, sys
args_file, config_dir, config_name = sys.argv[1:4]
args = [a for a in open(args_file, "rb").read().decode().split("\\0") if a]
res = {{"ok": False, "validated": None, "why": None, "config": None, "error": None}}
try:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name=config_name, overrides=args)
    res["config"] = OmegaConf.to_container(cfg, resolve=True)
    try:
        from verl.utils.config import validate_config
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
    except ImportError as e:
        res["why"] = f"this release has no verl.utils.config.validate_config ({{e}})"
    else:
        try:
            validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
        except BaseException as e:
            text = f"{{type(e).__name__}}: {{e}}".strip().splitlines()
            res["validated"], res["error"] = False, text[0] if text else type(e).__name__
        else:
            res["validated"] = True
    res["ok"] = True
except BaseException as e:
    text = f"{{type(e).__name__}}: {{e}}".strip().splitlines()
    res["error"] = text[0] if text else type(e).__name__
sys.stdout.write("\\n{RESULT}" + json.dumps(res, default=str) + "\\n")
sys.stdout.flush()
os._exit(0)
"""


# From verl 0.8, validate_config builds HFModelConfig, which reads the model's config and tokenizer
# from its path (the critic's asserts one architecture). verify has no network: the run's model
# paths point at a folder of the render's model shape instead (the memory plan's arch as a Qwen2
# config) with a three-word tokenizer. Validation reads sizes, never weights.
_SPECIALS = ("<unk>", "<|endoftext|>", "<|im_end|>")
MODEL_PATH_KEY = re.compile(r"^([+~]*(?:[\w-]+\.)*model\.path)=")


def write_model_shape(arch: Mapping[str, object], dest: Path) -> None:
    """config.json, tokenizer.json and tokenizer_config.json of a model of `arch`'s shape."""
    dest.mkdir(parents=True, exist_ok=True)
    moe = bool(arch.get("experts"))  # (a Qwen3-MoE: models.yaml's expert fields)
    mla = _fields(arch.get("mla"))  # (a DeepSeek-V3-style mixture)
    config = {
        "architectures": ["DeepseekV3ForCausalLM"]
        if mla
        else ["Qwen3MoeForCausalLM"]
        if moe
        else ["Qwen2ForCausalLM"],
        "model_type": "deepseek_v3" if mla else "qwen3_moe" if moe else "qwen2",
        "hidden_act": "silu",
        "hidden_size": arch["hidden_size"],
        "intermediate_size": arch["intermediate_size"],
        "num_hidden_layers": arch["layers"],
        "num_attention_heads": arch["attention_heads"],
        "num_key_value_heads": arch["kv_heads"],
        "vocab_size": arch["vocab_size"],
        "tie_word_embeddings": arch["tied_embeddings"],
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if mla:
        config.update(
            n_routed_experts=arch["experts"],
            num_experts_per_tok=arch["experts_per_token"],
            moe_intermediate_size=arch["moe_intermediate_size"],
            n_shared_experts=arch.get("shared_experts", 0),
            first_k_dense_replace=arch.get("dense_layers", 0),
            moe_layer_freq=1,
            q_lora_rank=mla["q_lora_rank"] or None,
            kv_lora_rank=mla["kv_lora_rank"],
            qk_nope_head_dim=_int(arch, "head_dim") - _int(mla, "qk_rope_head_dim"),
            qk_rope_head_dim=mla["qk_rope_head_dim"],
            v_head_dim=mla["v_head_dim"],
            n_group=1,
            topk_group=1,
            norm_topk_prob=True,
        )
    elif moe:
        config.update(
            head_dim=arch["head_dim"],
            num_experts=arch["experts"],
            num_experts_per_tok=arch["experts_per_token"],
            moe_intermediate_size=arch["moe_intermediate_size"],
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
        )
    special = [
        {
            "id": i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, t in enumerate(_SPECIALS)
    ]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": special,
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {
            "type": "WordLevel",
            "vocab": {t: i for i, t in enumerate(_SPECIALS)},
            "unk_token": "<unk>",
        },
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 32768,
        "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    }
    for name, doc in (
        ("config.json", config),
        ("tokenizer.json", tokenizer),
        ("tokenizer_config.json", tokenizer_config),
    ):
        (dest / name).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def _fields(value: object) -> Mapping[str, object]:
    """A mapping of the model's shape (an absent one: empty)."""
    if not value:
        return {}
    if isinstance(value, Mapping):
        return value
    raise TypeError(f"model shape: {value!r} is not a mapping")


def _int(fields: Mapping[str, object], key: str) -> int:
    value = fields[key]
    if not isinstance(value, int):
        raise TypeError(f"model shape: {key} is {value!r}, not a whole number")
    return value


def with_model_shape(args: list[str], folder: Path) -> list[str]:
    """The run's overrides with every `...model.path` pointed at `folder`."""
    out = []
    for a in args:
        m = MODEL_PATH_KEY.match(a)
        out.append(f"{m.group(1)}={folder}" if m else a)
    return out


def judge_validation(
    res: Mapping[str, object] | None, engine: bool, critic_engine: str
) -> tuple[Validation, str | None]:
    """What verify reports of verl's own validation and envbuild's batch arithmetic: (the report's
    `validation` entry, the failure to report or None)."""
    from envbuilder.model.batches import violations

    if res is None:
        return {"validated": None, "violations": []}, "validate: the interpreter printed no result"
    out: Validation = {"validated": res.get("validated"), "why": res.get("why"), "violations": []}
    if not res.get("ok"):
        return out, f"validate: {res.get('error')}"
    if res.get("validated") is False:
        return out, f"validate: verl's validate_config refused the run: {res.get('error')}"
    config = res.get("config")
    if isinstance(config, dict):
        out["violations"] = violations(config, engine, critic_engine)
    if out["violations"]:
        return out, "validate: verl's workers would refuse the batches: " + "; ".join(out["violations"][:2])
    return out, None


# Stands in for `python3` on the rendered run script's PATH: the preflight (it needs a GPU)
# passes, and verl's trainer gets `--cfg job`: Hydra composes and prints the config, then stops.
STUB = """#!/bin/sh
# envbuild verify: python3 for the rendered run script (compose only, no training)
case "$1" in
  */preflight.py) exit 0 ;;
esac
if [ "$1" = -m ] && [ "$2" = verl.trainer.main_ppo ]; then
  shift 2
  printf '%s\\0' "$@" > {args}
  exec {python} -m verl.trainer.main_ppo --cfg job "$@"
fi
echo "envbuild verify: the run script called python3 $*;" \
  "only the preflight and verl.trainer.main_ppo were expected" >&2
exit 97
"""

EXTENSION_WHY = {
    "apex": "apex {version} compiles its C++/CUDA extensions from NVIDIA's GitHub source archive "
    "with nvcc {cuda} (the image's builder stage); there is no PyPI wheel, and nothing is "
    "compiled here",
    "flash_attn": "flash-attn {version} has only an sdist on PyPI, which compiles with nvcc {cuda} "
    "for hours (the image's builder stage); nothing is compiled here",
}


class Options(Record):
    index_url: SecretUrl | None = None  # default: the profile's PyPI index
    torch_index_url: SecretUrl | None = None  # default: the profile's PyTorch index (+cuXXX builds)
    keep: Path | None = None  # keep the venv here instead of a temporary one
    skip_compose: bool = False
    # each module of the training path imported in an interpreter of its own (envbuild install
    # leaves it to preflight's smoke test, which imports the same modules in one)
    imports: bool = True
    # install into the venv at `keep` where an interrupted run left one (envbuild install), and
    # keep it when stopped: the next run goes on from what arrived
    resume: bool = False
    say: Callable[[str], None] = lambda line: None
    command: str = "verify"  # whose run this is: its work folder is envbuild-COMMAND-PROFILE-...
    # how a Compile step is done (envbuild install: compiled where torch's nvcc is on PATH);
    # None: named under not_installed, as verify compiles nothing
    compile: Callable[[Compile], bool] | None = None


from envbuilder.tools.python import Interpreter  # noqa: E402  (path, full version)


@dataclass  # not a record: the run fills it in as it goes (failures, imports, audit, ok)
class Report:
    profile: str
    python: str
    ok: bool = False
    interpreter: str | None = None
    index_url: str | None = None
    torch_index_url: str | None = None
    torch_swapped: str | None = None
    constraints: bool = False
    libcuda: str | None = None
    isolation: str | None = None
    layers: list[LayerEntry] = field(default_factory=list)
    patches: Patches | None = None
    audit: Audit | None = None
    not_installed: list[NotInstalled] = field(default_factory=list)
    compiled: list[Compiled] = field(default_factory=list)  # what verify compiled itself (Compile steps)
    imports: list[ImportEntry] = field(default_factory=list)
    compose: Compose | None = None
    failures: list[str] = field(default_factory=list)
    venv: str | None = None
    seconds: float = 0.0

    def as_dict(self) -> VerifyReport:
        """The fields in their order (the JSON's keys)."""
        return VerifyReport(
            profile=self.profile,
            python=self.python,
            ok=self.ok,
            interpreter=self.interpreter,
            index_url=self.index_url,
            torch_index_url=self.torch_index_url,
            torch_swapped=self.torch_swapped,
            constraints=self.constraints,
            libcuda=self.libcuda,
            isolation=self.isolation,
            layers=self.layers,
            patches=self.patches,
            audit=self.audit,
            not_installed=self.not_installed,
            compiled=self.compiled,
            imports=self.imports,
            compose=self.compose,
            failures=self.failures,
            venv=self.venv,
            seconds=self.seconds,
        )


# ---- the profile's Python ---------------------------------------------------------------------


def find_python(version: str) -> Interpreter | None:
    """A Python `version` (X.Y) with venv and ensurepip (tools/python.py's search order)."""
    from envbuilder.tools.python import find_python as find

    return find(version, need_venv=True)


def _clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment minus uv's index settings (lock.pip's rule), pip's settings and
    anything that would put other code on the venv's path: only the indexes named on the command
    line are used, never the host's pip.conf, find-links or global constraints."""
    from envbuilder.tools.python import isolated_env

    return isolated_env(**extra)


_ISOLATION: tuple[list[str], str] | None = None


def isolation() -> tuple[list[str], str]:
    """(command prefix, description) that runs a child with no network: a new network namespace
    where the kernel allows one (only a loopback that is down), else proxies at a closed port."""
    global _ISOLATION
    if _ISOLATION is None:
        _ISOLATION = ([], "HTTP(S) proxies pointed at a closed loopback port (no network namespace)")
        exe = shutil.which("unshare")
        for flags in (["-n"], ["-r", "-n"]):
            if not exe:
                break
            try:
                ok = (
                    subprocess.run([exe, *flags, "--", "true"], capture_output=True, timeout=10).returncode
                    == 0
                )
            except (OSError, subprocess.TimeoutExpired):
                ok = False
            if ok:
                _ISOLATION = ([exe, *flags, "--"], f"no network (unshare {' '.join(flags)})")
                break
    return _ISOLATION


def _offline_env(home: Path, **extra: str) -> dict[str, str]:
    dead = "http://127.0.0.1:9"  # discard port: nothing answers
    env = _clean_env(
        CUDA_VISIBLE_DEVICES="",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HOME=str(home),
        XDG_CACHE_HOME=str(home / ".cache"),
        HTTP_PROXY=dead,
        HTTPS_PROXY=dead,
        http_proxy=dead,
        https_proxy=dead,
        ALL_PROXY=dead,
        all_proxy=dead,
        NO_PROXY="",
        no_proxy="",
        RAY_USAGE_STATS_ENABLED="0",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    env.update(extra)
    return env


# ---- running children with progress, timeouts and Ctrl-C -------------------------------------------


class Ran(Record):
    rc: int | None  # None: it ran past its time limit and was stopped
    out: str
    err: str
    seconds: float


def run(
    cmd: list[str],
    *,
    env: dict[str, Any],
    cwd: Path | None = None,
    timeout: float,
    say: Callable[[str], None] = lambda s: None,
    label: str = "",
    forward: Callable[[str], bool] | None = None,
) -> Ran:
    """Run `cmd`, collect its output, forward chosen stderr lines as progress, say that it is
    still working every HEARTBEAT_S, and stop it (its whole group) on timeout or Ctrl-C."""
    start = time.monotonic()
    out: list[str] = []
    err: list[str] = []

    def pump(stream: IO[str], sink: list[str], fwd: Callable[[str], bool] | None) -> None:
        for line in stream:
            sink.append(line)
            if fwd and fwd(line.rstrip("\n")):
                say(f"  {label}: {line.strip()}")

    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        text=True,
        errors="replace",
    )
    rc: int | None = None
    try:  # from here on, Ctrl-C (or anything else) never leaves the child running
        threads = [
            threading.Thread(target=pump, args=(proc.stdout, out, None), daemon=True),
            threading.Thread(target=pump, args=(proc.stderr, err, forward), daemon=True),
        ]
        for t in threads:
            t.start()
        while True:
            try:
                rc = proc.wait(min(HEARTBEAT_S, max(0.1, timeout - (time.monotonic() - start))))
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - start
                if elapsed >= timeout:
                    stop_group(proc)
                    rc = None
                    break
                say(f"  {label}: still working ({fmt_seconds(elapsed)})")
    except BaseException:
        stop_group(proc)
        raise
    for t in threads:
        t.join(10)
    return Ran(rc, "".join(out), "".join(err), time.monotonic() - start)


def fmt_seconds(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


# ---- what gets installed --------------------------------------------------------------------------

_PIN = re.compile(r"^(\s*)([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;+#]+)(\+[^\s;#]+)?(.*)$")


from envbuilder.text import canonical_name as _norm  # noqa: E402  (PEP 503, one place)


def local_pins(packages: Sequence[str]) -> dict[str, tuple[str, str]]:
    """{normalized name: (pinned version with its +local label, the same without)} for the pins
    that name a local build (`torch==2.6.0+cu118`): the ones only the PyTorch index has."""
    out = {}
    for req in packages:
        m = _PIN.match(req)
        if m and m[5]:
            out[_norm(m[2])] = (m[4] + m[5], m[4])
    return out


def swap_line(line: str, swap: dict[str, tuple[str, str]]) -> str:
    """A requirement or constraint line with a swapped pin's local label removed."""
    m = _PIN.match(line)
    if m and m[5] and _norm(m[2]) in swap and swap[_norm(m[2])][0] == m[4] + m[5]:
        return f"{m[1]}{m[2]}{m[3] or ''}=={m[4]}{m[6]}"
    return line


def index_answers(url: str | SecretUrl, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a PEP 503 index answers (short timeout; proxies from the environment):
    net.index_answers, the one rule `envbuild lock` and `check --resolve` use too."""
    from envbuilder.oci.http import index_answers as answers

    return answers(url, timeout)


def import_plan(env: ResolvedEnv) -> tuple[list[str], dict[str, str]]:
    """(the modules a training run imports, in order; {top-level module: component} for the
    compiled extensions among them, from each component's `modules` in the resolved env)."""
    modules = list(env.training_path)
    ext: dict[str, str] = {}
    for comp, part in (("apex", env.apex), ("flash_attn", env.flash_attn)):
        for mod in part.modules if part else ():
            ext[mod.split(".")[0]] = comp
    return modules, ext


# ---- a libcuda for loading, where the machine has no driver ----------------------------------------

_DRIVER_SYMBOL = re.compile(r"^(cu[A-Z]\w*)(@.*)?$")  # the driver API (cudart's are cuda[A-Z]...)


def libcuda_users(site: Path, packages: set[str]) -> dict[Path, set[str]]:
    """{shared object: the driver-API symbols it leaves undefined} for the .so files under the
    given top-level packages of `site` that need libcuda.so.1 (readelf's NEEDED entries)."""
    readelf, nm = shutil.which("readelf"), shutil.which("nm")
    if not (readelf and nm):
        return {}
    out: dict[Path, set[str]] = {}
    for pkg in sorted(packages):
        root = site / pkg
        if not root.is_dir():
            continue
        for so in sorted(root.rglob("*.so")):
            try:
                dyn = subprocess.run(
                    [readelf, "-d", "-W", str(so)], capture_output=True, text=True, timeout=60
                ).stdout
                if "[libcuda.so.1]" not in dyn:
                    continue
                und = subprocess.run(
                    [nm, "-D", "--undefined-only", str(so)], capture_output=True, text=True, timeout=60
                ).stdout
            except (OSError, subprocess.TimeoutExpired):
                continue
            syms = {
                m[1]
                for m in (_DRIVER_SYMBOL.match(ln.split()[-1]) for ln in und.splitlines() if ln.strip())
                if m
            }
            out[so] = syms
    return out


def build_libcuda_stub(symbols: list[str], out: Path) -> bool | str:
    """Compile out/libcuda.so.1 exporting `symbols`, each returning 34 (CUDA_ERROR_STUB_LIBRARY).
    True, or why not."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return "no C compiler (cc)"
    out.mkdir(parents=True, exist_ok=True)
    src = out / "libcuda_stub.c"
    src.write_text(
        "".join(f"int {name}(void) {{ return 34; }}\n" for name in symbols)
        or "int cuInit(void) { return 34; }\n",
        encoding="utf-8",
    )
    try:
        got = subprocess.run(
            [cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(out / "libcuda.so.1"), str(src)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return True if got.returncode == 0 else (got.stderr.strip().splitlines() or ["cc failed"])[-1]


# ---- the composed config ----------------------------------------------------------------------------


def parse_printed_config(text: str) -> dict[str, object] | None:
    """The YAML that `--cfg job` prints, skipping anything imports printed before it."""
    import yaml

    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^[A-Za-z_][\w-]*:(\s|$)", line):
            try:
                doc = yaml.safe_load("\n".join(lines[i:]))
            except yaml.YAMLError:
                continue
            if isinstance(doc, dict):
                return doc
    return None


from envbuilder.model.batches import MISSING as _MISSING  # noqa: E402
from envbuilder.model.batches import lookup as _lookup  # noqa: E402  (one dotted-key walk)


def _same(composed: object, text: str) -> bool:
    """Whether a Hydra override value (as the script passed it) is what the config holds."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    if composed is None:
        return text.lower() in ("null", "~", "none")
    if isinstance(composed, bool):
        return text.lower() == str(composed).lower()
    if isinstance(composed, (int, float)):
        try:
            return float(text) == float(composed)
        except ValueError:
            return False
    if isinstance(composed, list):
        if not (text.startswith("[") and text.endswith("]")):
            return False
        values: list[object] = composed
        items = [x.strip() for x in text[1:-1].split(",") if x.strip()]
        return len(items) == len(values) and all(_same(c, t) for c, t in zip(values, items))
    return str(composed) == text


def check_overrides(cfg: Mapping[str, object], args: list[str]) -> tuple[int, list[Mismatch]]:
    """(how many overrides were compared, the ones whose value the composed config does not
    hold). Deletions (~key) and interpolated values are not compared."""
    wrong: list[Mismatch]
    checked, wrong = 0, []
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep or key.startswith("~") or "${" in value:
            continue
        key = key.lstrip("+")
        got: object = _lookup(cfg, key)
        checked += 1
        if got is _MISSING or not _same(got, value):
            wrong.append(
                {"override": arg, "composed": None if got is _MISSING else json.dumps(got, default=str)}
            )
    return checked, wrong


def hydra_error(stderr: str) -> str:
    """Hydra's message (`Could not override 'x'. ... Key 'x' is not in struct`), or the last line
    of a Python traceback."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    if any(ln.startswith("Traceback") for ln in lines):
        return lines[-1]
    lines = [ln for ln in lines if "HYDRA_FULL_ERROR" not in ln]
    return " / ".join(lines[:3]) if lines else "(no message)"


# ---- one profile ------------------------------------------------------------------------------------


class _Verifier:
    def __init__(self, ctx: BuildContext, interp: Interpreter, opts: Options):
        env = ctx.env  # (the resolver's, within the lock's pins: what the steps install)
        self.ctx = ctx
        self.env = env
        self.interp = interp
        self.opts = opts
        self.say: Callable[[str], None] = lambda s: opts.say(f"[{env.name}] {s}")
        self.r = Report(profile=env.name, python=env.python, interpreter=f"{interp.path} ({interp.version})")

    def fail(self, text: str) -> None:
        from envbuilder.text import redact

        text = redact(text)  # (a child's message may name an index with its password)
        self.r.failures.append(text)
        self.say(f"FAILED: {text}")

    def run(self, work: Path, venv: Path) -> Report:
        """The install's steps (render/steps.py) in turn, as every route runs them, then the
        imports of the training path and verl's composed config."""
        from envbuilder.render import files as R
        from envbuilder.render.steps import install_steps

        env, r = self.env, self.r
        r.isolation = isolation()[1]
        # as `envbuild render` does: the pins of the lock whose plan this is, per layer, as
        # context.prepare found them (`install --locked`: that lock's alone)
        files = R.render_files(self.ctx)
        self.rendered = work / "render"
        R.write_dir(self.rendered, files)
        self.work, self.venv, self.py = work, venv, venv / "bin" / "python"
        self.indexes(files)
        self.audit = "audit_precision.py" in files
        self.installed_all = True
        self.empty = [name for name, roots in layer_roots(env).items() if not roots]
        for step in install_steps(env, self.ctx.plan):
            if not self.step(step):
                return r
        self.empty_layers(None)
        if self.opts.imports:
            self.imports(self.py, work)
        if self.opts.skip_compose:
            r.compose = {"skipped": "--skip-compose"}
        else:
            self.compose(self.py, work, self.rendered)
        return r

    def step(self, step: Step) -> bool:
        """Run one step; False: the run stops here (no environment to go on in)."""
        if isinstance(step, Venv):
            return self.make_venv()
        if isinstance(step, PipLayer):
            self.empty_layers(step.layer.name)
            self.layer(step)
            return True
        if isinstance(step, Compile):
            self.compile(step)
            return True
        if not self.installed_all:
            self.empty_layers(None)
            return False  # (nothing to patch or audit: an earlier layer did not install)
        self.script(step)
        return True

    def indexes(self, files: Mapping[str, str]) -> None:
        """The indexes, and the torch swap when the PyTorch index does not answer; the lock's
        pins (render's constraints/<layer>.txt, one set per layer, all from one lock) as one
        file: their union constrains every layer, as the Dockerfile's cumulative -c does."""
        from envbuilder.tools.uv import index_env

        env, r = self.env, self.r
        pypi = self.opts.index_url or SecretUrl(env.indexes.pypi)
        torch_index = self.opts.torch_index_url or secret(env.indexes.torch)
        swap: dict[str, tuple[str, str]] = {}
        if torch_index:
            self.say(f"PyTorch index {torch_index}: probing ({PROBE_TIMEOUT_S:.0f} s at most)")
            if not index_answers(torch_index):
                swap = local_pins(env.torch.packages)
                self.say(
                    f"PyTorch index {torch_index} does not answer"
                    + ("; its +cu builds are swapped for PyPI's" if swap else "")
                )
                torch_index = None
        # (the report is printed and written: the URLs as ***@)
        r.index_url, r.torch_index_url = str(pypi), str(torch_index) if torch_index else None
        if swap:
            old, new = swap.get("torch") or next(iter(swap.values()))
            r.torch_swapped = f"{old} -> {new} (PyPI; the PyTorch index is unreachable)"
            self.say(f"torch {r.torch_swapped}")
        self.swap = swap
        self.constraints: Path | None = None
        layer_files = [name for name in sorted(files) if name.startswith("constraints/")]
        if layer_files:
            self.constraints = self.work / "constraints.txt"
            self.constraints.write_text(
                "".join(
                    swap_line(ln, swap) + "\n"
                    for name in layer_files
                    for ln in files[name].splitlines()
                    if ln.strip() and not ln.startswith("#")
                ),
                "utf-8",
            )
            r.constraints = True
        # the indexes reach uv through its environment (their passwords are in no argv); with
        # the PyTorch index, as pip merges the Dockerfile's --index-url and --extra-index-url
        self.index_env = index_env(pypi, torch_index)
        self.index_args = ["--index-strategy", "unsafe-best-match"] if torch_index else []

    def make_venv(self) -> bool:
        """The venv, pip seeded by ensurepip (no index needed); False where it failed."""
        venv, py = self.venv, self.py
        if self.opts.resume and py.exists() and seeded(venv):
            self.say(f"venv {venv}: going on with the environment an earlier run made")
            return True
        # (a venv an earlier run left without pip, stopped while seeding it, is made again)
        self.say(f"venv {venv} from Python {self.interp.version} ({self.interp.path})")
        made = run(
            [self.interp.path, "-m", "venv", str(venv)],
            env=_clean_env(),
            timeout=600,
            say=self.say,
            label="venv",
        )
        if made.rc != 0 or not py.exists():
            self.fail(
                f"venv: {self.interp.path} -m venv failed: "
                f"{(made.err.strip().splitlines() or ['timed out'])[-1]}"
            )
            return False
        return True

    def empty_layers(self, before: str | None) -> None:
        """The report's entries for the layers this profile has none of (p40's vllm: its
        rollout is HF), each where the Dockerfile's order puts it: those before `before` (None:
        the rest)."""
        order = list(layer_roots(self.env))
        upto = order.index(before) if before in order else len(order)
        for name in [n for n in self.empty if order.index(n) < upto]:
            self.empty.remove(name)
            self.r.layers.append(
                {
                    "layer": name,
                    "requirements": [],
                    "ok": True,
                    "seconds": 0.0,
                    "empty": True,
                    "pip_check": None,
                }
            )

    def layer(self, step: PipLayer) -> None:
        """One pip layer with uv, within the lock's pins, then `pip check`."""
        from envbuilder.text import redact
        from envbuilder.tools.uv import uv_bin

        name, py = step.layer.name, self.py
        roots = [swap_line(x, self.swap) for x in step.layer.requirements]
        entry: LayerEntry = {
            "layer": name,
            "requirements": roots,
            "ok": False,
            "seconds": 0.0,
            "error": None,
            "pip_check": None,
        }
        self.r.layers.append(entry)
        if not self.installed_all:
            entry["error"] = "not run: an earlier layer did not install"
            return
        self.say(f"layer {name}: uv pip install {' '.join(roots)}")
        cmd = [uv_bin(), "pip", "install", "--no-config", "--python", str(py), *self.index_args]
        if self.constraints:
            cmd += ["-c", str(self.constraints)]
        got = run(
            cmd + roots,
            env=_clean_env(**self.index_env),
            cwd=self.work,
            timeout=INSTALL_TIMEOUT_S,
            say=self.say,
            label=f"layer {name}",
            forward=lambda ln: ln.startswith(_UV_PROGRESS),
        )
        entry["seconds"] = round(got.seconds, 1)
        if got.rc != 0:
            self.installed_all = False
            text = [
                ln for ln in got.err.strip().splitlines() if ln.strip() and not ln.startswith("Using Python")
            ]
            entry["error"] = (
                ("timed out after " + fmt_seconds(got.seconds))
                if got.rc is None
                else redact("\n".join(text[-25:]))
            )
            why = _first_error(text) if got.rc else entry["error"]
            self.fail(f"layer {name} did not install: {why}")
            return
        entry["ok"] = True
        self.say(f"layer {name}: installed in {fmt_seconds(got.seconds)}; pip check")
        chk = run(
            [str(py), "-m", "pip", "check"],
            env=_clean_env(),
            cwd=self.work,
            timeout=600,
            say=self.say,
            label="pip check",
        )
        problems = [ln.strip() for ln in (chk.out + chk.err).splitlines() if ln.strip()]
        entry["pip_check"] = {"ok": chk.rc == 0, "problems": [] if chk.rc == 0 else problems}
        if chk.rc != 0:
            self.fail(
                f"pip check after layer {name}: "
                + "; ".join(problems[:3])
                + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")
            )

    def compile(self, step: Compile) -> None:
        """A Compile step: done by the caller's `compile` (envbuild install), once every layer
        installed; TransformerEngine's PyTorch extension here, with PyPI's CUDA compiler (the
        Megatron engine's every module imports it); else named under not_installed with why
        nothing is compiled here."""
        if step.component == TRANSFORMER_ENGINE:  # (verify and install alike: torch's CUDA, exactly)
            if self.installed_all and not self.r.failures:
                self.compile_with_pypi_toolchain(step)
            return
        if self.opts.compile is not None:
            if self.installed_all and not self.r.failures and not self.opts.compile(step):
                self.fail(f"{step.component} did not compile")
            return
        comp = step.component.replace("-", "_")
        _, ext = import_plan(self.env)
        self.r.not_installed.append(
            {
                "component": comp,
                "version": step.version,
                "modules": sorted(m for m, c in ext.items() if c == comp),
                "why": EXTENSION_WHY[comp].format(version=step.version, cuda=self.env.cuda.version),
            }
        )

    def site_packages(self, py: Path) -> str:
        """The venv's site-packages folder, as its Python says ("" where it says nothing)."""
        return run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
            env=_clean_env(),
            timeout=60,
            label="site-packages",
        ).out.strip()

    def compile_with_pypi_toolchain(self, step: Compile) -> None:
        """Compile `step` into the venv with PyPI's CUDA compiler for torch's CUDA
        (model/components/transformer_engine.py TOOLCHAIN), as the builder stage does with the
        devel image's: the toolchain's wheels first, then the component's own command. Reported
        under `compiled`, with how long each part took."""
        from envbuilder.model.components import transformer_engine as TE
        from envbuilder.render.steps import compile_argv
        from envbuilder.tools.uv import uv_bin

        py, env = self.py, self.env
        entry: Compiled = {
            "component": step.component,
            "version": step.version,
            "arch": step.arch,
            "ok": False,
        }
        self.r.compiled.append(entry)
        tools = TE.toolchain(env)
        self.say(f"{step.component}: PyPI's CUDA {env.torch.cuda} compiler into the venv: {' '.join(tools)}")
        got = run(
            [uv_bin(), "pip", "install", "--no-config", "--python", str(py), *self.index_args, *tools],
            env=_clean_env(**self.index_env),
            cwd=self.work,
            timeout=INSTALL_TIMEOUT_S,
            say=self.say,
            label="toolchain",
        )
        entry["toolchain"], entry["toolchain_seconds"] = tools, round(got.seconds, 1)
        if got.rc != 0:
            self.fail(
                f"{step.component}: PyPI's CUDA compiler did not install: {_first_error(got.err.splitlines())}"
            )
            return
        site = self.site_packages(py)
        home = TE.toolchain_home(env, site)
        jobs = str(os.cpu_count() or 1)
        cmd = compile_argv(env, step, [str(py), "-m", "pip", "install", "-v"])
        minutes = TE.CORE_MINUTES // max(int(jobs), 1)
        self.say(
            f"{step.component}: compiling {TE.DIST} {step.version} for sm_{step.arch} with {jobs} jobs "
            f"(expect about {minutes} min)"
        )
        path = os.pathsep.join([f"{home}/bin", str(py.parent), os.environ.get("PATH", "")])
        got = run(
            cmd,
            env=_clean_env(
                **self.index_env, CUDA_HOME=home, PATH=path, MAX_JOBS=jobs, CPATH=TE.include_path(site)
            ),
            cwd=self.work,
            timeout=COMPILE_TIMEOUT_S,
            say=self.say,
            label=f"build {step.component}",
        )
        entry["seconds"], entry["jobs"] = round(got.seconds, 1), int(jobs)
        if got.rc != 0:
            why = (
                "timed out after " + fmt_seconds(got.seconds)
                if got.rc is None
                else _first_error(got.err.splitlines())
            )
            entry["error"] = why
            self.fail(f"{step.component} did not compile: {why}")
            return
        entry["ok"] = True
        self.say(f"{step.component}: compiled in {fmt_seconds(got.seconds)}")

    def script(self, step: RunScript) -> None:
        """A script of the rendered folder with the venv's Python: verl's recorded patches (the
        one rule of every route: the venv's own verl, isolated, never written through a link),
        or the precision audit, as the image build runs it right after the patches."""
        py, work, rendered = self.py, self.work, self.rendered
        if step.script == PATCHES:
            names = [p.name for p in self.env.patches]
            self.say(f"patches: {', '.join(names)}")
            argv, patch_env = patch_command(py, rendered / step.script, _clean_env())
            got = run(argv, env=patch_env, cwd=work, timeout=600, say=self.say, label="patches")
            self.r.patches = {
                "ok": got.rc == 0,
                "names": names,
                "output": (got.out + got.err).strip().splitlines(),
            }
            if got.rc != 0:
                msg = (got.err.strip().splitlines() or ["timed out" if got.rc is None else "failed"])[-1]
                self.r.patches["error"] = msg
                self.fail(f"patches: {msg}")
            return
        if not self.audit:
            return
        self.say("precision audit")
        got = run(
            [str(py), str(rendered / step.script)],
            env=_clean_env(),
            cwd=work,
            timeout=600,
            say=self.say,
            label="audit",
        )
        self.r.audit = {"ok": got.rc == 0, "output": (got.out + got.err).strip().splitlines()}
        if got.rc != 0:
            lines = self.r.audit["output"] or ["timed out" if got.rc is None else "failed"]
            self.fail("precision audit: " + "; ".join(lines[-3:]))

    def imports(self, py: Path, work: Path) -> None:
        modules, ext = import_plan(self.env)
        home = work / "home"
        home.mkdir(exist_ok=True)
        cwd = work / "imports"
        cwd.mkdir(exist_ok=True)
        prefix = isolation()[0]
        extra = {}
        stub = self.libcuda(py, work, {m.split(".")[0] for m in modules} - set(ext))
        if stub:
            extra["LD_LIBRARY_PATH"] = os.pathsep.join(
                [str(stub)] + [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
            )
        for mod in modules:
            if mod.split(".")[0] in ext:
                continue  # reported under not_installed
            self.say(f"import {mod}")
            got = run(
                [*prefix, str(py), "-c", IMPORT_SNIPPET, mod],
                env=_offline_env(home, **extra),
                cwd=cwd,
                timeout=IMPORT_TIMEOUT_S,
                say=self.say,
                label=f"import {mod}",
            )
            res = _result(got.out)
            entry: ImportEntry = {
                "module": mod,
                "ok": bool(res and res["ok"]),
                "seconds": round(got.seconds, 1),
                "error": None,
            }
            if res is None:
                tail = [ln for ln in got.err.strip().splitlines() if ln.strip()]
                entry["error"] = (
                    f"timed out after {fmt_seconds(got.seconds)}"
                    if got.rc is None
                    else f"the interpreter died (exit {got.rc})" + (f": {tail[-1]}" if tail else "")
                )
            elif not res["ok"]:
                entry["error"] = str(res["error"])
                missing = str(res.get("missing") or "").split(".")[0]
                if missing in ext:
                    entry["needs"] = ext[missing]
                    entry["error"] = f"{res['error']} ({ext[missing]} is not installed here)"
            self.r.imports.append(entry)
            if not entry["ok"]:
                self.fail(f"import {mod}: {entry['error']}")

    def libcuda(self, py: Path, work: Path, packages: set[str]) -> Path | None:
        """Compiled modules may link the driver's libcuda.so.1 (vllm._C does), which a machine
        without an NVIDIA driver lacks, so the loader stops before it checks anything else (the
        torch ABI). As the image's preflight loads CUDA's forward-compat libcuda there, this
        builds a stub that exports the driver-API symbols those modules name (each returns
        CUDA_ERROR_STUB_LIBRARY): the modules load, nothing calls the driver. The directory to
        put on LD_LIBRARY_PATH, or None where the host has a libcuda or nothing links one."""
        probe = run(
            [str(py), "-c", "import ctypes; ctypes.CDLL('libcuda.so.1')"],
            env=_clean_env(),
            timeout=60,
            label="libcuda",
        )
        if probe.rc == 0:
            self.r.libcuda = "the host's NVIDIA driver"
            return None
        site = self.site_packages(py)
        linked = libcuda_users(Path(site), packages) if site else {}
        if not linked:
            return None
        names = sorted({sym for syms in linked.values() for sym in syms})
        where = ", ".join(str(f.relative_to(site)) for f in sorted(linked))
        out = work / "libcuda-stub"
        made = build_libcuda_stub(names, out)
        if made is not True:
            self.r.libcuda = (
                f"none on this machine, and no stub could be built ({made}): {where} will not load"
            )
            self.say(f"libcuda: {self.r.libcuda}")
            return None
        self.r.libcuda = (
            f"no NVIDIA driver here: a stub libcuda.so.1 exporting the {len(names)} "
            f"driver-API symbols that {where} link stands in, for loading only "
            "(every call returns CUDA_ERROR_STUB_LIBRARY)"
        )
        self.say(f"libcuda: {self.r.libcuda}")
        return out

    def compose(self, py: Path, work: Path, rendered: Path) -> None:
        from envbuilder.render.image import RUN_SCRIPT

        base = work / "compose"
        stub_dir, data = base / "bin", base / "data"
        stub_dir.mkdir(parents=True)
        data.mkdir()
        (base / "home").mkdir()
        for name in ("train.parquet", "test.parquet"):
            (data / name).write_bytes(b"")
        args_file = base / "args"
        stub = stub_dir / "python3"
        stub.write_text(
            STUB.format(args=shlex.quote(str(args_file)), python=shlex.quote(str(py))), encoding="utf-8"
        )
        stub.chmod(0o755)
        env = _offline_env(
            base / "home", PATH=f"{stub_dir}{os.pathsep}{os.environ.get('PATH', '')}", DATA_DIR=str(data)
        )
        for k in ("MODEL", "N_GPUS"):  # the script's own defaults, not the caller's
            env.pop(k, None)
        self.say(f"compose: {RUN_SCRIPT} with verl's Hydra config (--cfg job)")
        got = run(
            [*isolation()[0], "bash", str(rendered / RUN_SCRIPT)],
            env=env,
            cwd=base,
            timeout=COMPOSE_TIMEOUT_S,
            say=self.say,
            label="compose",
        )
        c: Compose = {
            "ok": False,
            "checked": 0,
            "mismatches": [],
            "error": None,
            "seconds": round(got.seconds, 1),
        }
        self.r.compose = c
        args = [a for a in args_file.read_bytes().decode().split("\0") if a] if args_file.exists() else []
        c["overrides"] = len([a for a in args if "=" in a])
        if got.rc != 0:
            c["error"] = (
                f"timed out after {fmt_seconds(got.seconds)}" if got.rc is None else hydra_error(got.err)
            )
            self.fail(f"compose: rejected: {c['error']}")
            return
        cfg = parse_printed_config(got.out)
        if cfg is None:
            c["error"] = "exit 0 but no config was printed (is --cfg job supported by this verl?)"
            self.fail(f"compose: {c['error']}")
            return
        c["checked"], c["mismatches"] = check_overrides(cfg, args)
        spot: dict[str, object] = {}
        for key in (
            "actor_rollout_ref.rollout.name",
            "actor_rollout_ref.rollout.dtype",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        ):
            got_v: object = _lookup(cfg, key)
            spot[key] = None if got_v is _MISSING else got_v
        c["values"] = spot
        if c["checked"] == 0:
            c["error"] = "the run script passed no overrides to compare"
            self.fail(f"compose: {c['error']}")
        elif c["mismatches"]:
            c["error"] = "composed config differs: " + "; ".join(
                f"{m['override']} (composed: {m['composed']})" for m in c["mismatches"][:3]
            )
            self.fail(f"compose: {c['error']}")
        else:
            c["ok"] = True
            self.validate(py, base, args, c)

    def validate(self, py: Path, base: Path, args: list[str], c: Compose) -> None:
        """verl's own validate_config on the composed run (`args`: the overrides the run script
        passed), then the batch arithmetic its workers assert at run time
        (envbuilder/model/batches.py): a render verl would reject fails here. `c`: the report's
        compose entry, which takes the result."""
        from envbuilder.machine.compose import main_ppo_config

        sites = sorted(py.parent.parent.glob("lib/python*/site-packages"))
        site = next((p for p in sites if (p / "verl" / "trainer" / "main_ppo.py").exists()), None)
        if site is None:
            c["validation"] = {"validated": None, "why": "verl's main_ppo.py not found"}
            return
        config_dir, name = main_ppo_config(site)
        shape = base / "model-shape"
        write_model_shape(self.env.memory.arch.to_dict(), shape)
        args = with_model_shape(args, shape)
        args_file = base / "args-validate"
        args_file.write_bytes("\0".join(args).encode())
        self.say("validate: verl's validate_config and the batch arithmetic")
        got = run(
            [*isolation()[0], str(py), "-c", VALIDATE_SNIPPET, str(args_file), str(config_dir), name],
            env=_offline_env(base / "home"),
            cwd=base,
            timeout=COMPOSE_TIMEOUT_S,
            say=self.say,
            label="validate",
        )
        entry, failure = judge_validation(
            _result(got.out), self.env.verl.engine_batches, self.env.verl.critic_fsdp
        )
        c["validation"] = entry
        if failure:
            c["ok"] = False
            c["error"] = failure
            self.fail(failure)


def _result(out: str) -> dict[str, object] | None:
    """The JSON object of a snippet's last marked line (IMPORT_SNIPPET's, VALIDATE_SNIPPET's),
    None where it printed none."""
    for line in reversed(out.splitlines()):
        if line.startswith(RESULT):
            res: object = json.loads(line[len(RESULT) :])
            return res if isinstance(res, dict) else None
    return None


def seeded(venv: Path) -> bool:
    """Whether the venv's pip is whole: ensurepip writes pip's RECORD last, so a venv step that
    was stopped (Ctrl-C, SIGTERM) before the end has none."""
    return any(venv.glob("lib/python*/site-packages/pip-*.dist-info/RECORD"))


def unshare_files(venv: Path, rels: list[str]) -> None:
    """Give each file the patches edit an inode of its own. uv hard-links installed files to
    its cache, and apply_patches.py writes in place: without this, patching one venv patches
    the cache, and every later venv gets an already-patched verl."""
    for site in venv.glob("lib/python*/site-packages"):
        for rel in dict.fromkeys(rels):
            path = site / rel
            if path.is_file() and not path.is_symlink() and path.stat().st_nlink > 1:
                tmp = path.with_name(f".{path.name}.envbuild-copy")
                shutil.copy2(path, tmp)
                os.replace(tmp, path)


def _first_error(lines: list[str]) -> str:
    """The line of uv's output that says what went wrong, with the one after it."""
    for i, ln in enumerate(lines):
        s = ln.strip()
        if s.startswith(("error:", "×", "ERROR")) or "No solution found" in s:
            nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return f"{s} {nxt}".strip()
    return lines[-1].strip() if lines else "(no message)"


def verify(ctx: BuildContext, interp: Interpreter, opts: Options) -> Report:
    """Verify one prepared profile (context.prepare). Its temporary directory (and a --keep venv
    left unfinished by Ctrl-C) is removed whatever happens."""
    env = ctx.env
    start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f"envbuild-{opts.command}-{env.name}-"))
    venv = opts.keep if opts.keep else work / "venv"
    v = _Verifier(ctx, interp, opts)
    try:
        report = v.run(work, venv)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        if opts.resume:
            opts.say(f"[{env.name}] stopped: {venv} keeps what arrived; run the same command to go on")
            raise
        if opts.keep and venv.exists() and (venv / "pyvenv.cfg").exists():
            shutil.rmtree(venv, ignore_errors=True)  # an unfinished venv is of no use
        opts.say(f"[{env.name}] stopped: removed the unfinished venv and {work}")
        raise
    report.ok = not report.failures
    if opts.keep and venv.exists():
        report.venv = str(venv)
    v.say(f"removing {work}")
    shutil.rmtree(work, ignore_errors=True)
    report.seconds = round(time.monotonic() - start, 1)  # the wall time, removal included
    return report


def check_keep(path: Path) -> None:
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UserError(
            f"--keep {path} exists and is not an empty directory; verify makes a "
            "fresh venv there. Pass a new path."
        )
