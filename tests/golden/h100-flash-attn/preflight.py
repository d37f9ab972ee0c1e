#!/usr/bin/env python3
"""Preflight for envbuild profile h100 (NVIDIA H100, CC 9.0): run inside the image.

The same rules envbuild's resolver applied when it rendered this image, checked against the real
GPU: its arch against torch.cuda.get_arch_list(), the dtype it supports, the driver; and every
module of the training path, what `python -m verl.trainer.main_ppo` imports down to the FSDP
workers, the rollout and the compiled extensions. No check raises: a failure is a line with its
fix. Without a GPU the GPU checks fail and the imports are checked all the same.

  --json    the report as JSON
  --quiet   print nothing when every check passes
  --smoke   only the checks that need no GPU (torch build, imports): what `envbuild build` runs
  --overrides ARGS...   (last) the run's extra Hydra overrides, checked before anything starts:
            one this verl release cannot run (EXPECTED's refused_overrides) and a `+`/`++` key
            that verl's own config does not have and its code does not read (Hydra's `++`
            adds any key silently, and a misspelt one is never read) are refused, exit 2

Exit 0 when every check passes, 1 when one fails, 2 on a bad argument.
"""

import importlib
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

EXPECTED = json.loads("{\"compat_driver\": \"580.65.06\", \"compat_libcuda\": \"/usr/local/cuda/compat/libcuda.so.1\", \"compute_capability\": \"9.0\", \"config_reads\": [\"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype\", \"actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype\", \"actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype\", \"actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype\", \"critic.fsdp.mixed_precision.param_dtype\", \"critic.fsdp.use_dynamic_bsz\", \"critic.fsdp.micro_batch_size_per_gpu\", \"critic.fsdp.infer_micro_batch_size_per_gpu\"], \"driver_cuda\": \"13.0\", \"dtype\": \"bf16\", \"finish\": \"python audit_precision.py\", \"gpu\": \"NVIDIA H100\", \"min_driver\": \"580.82.07\", \"model_vram_gb\": 60, \"patches\": [], \"profile\": \"h100\", \"refused_overrides\": [], \"torch_compile\": true, \"torch_cuda\": \"13.0\", \"torch_dtype\": \"bfloat16\", \"torch_index\": \"https://pypi.org/simple\", \"torch_requirement\": \"torch==2.11.0\", \"torch_version\": \"2.11.0\", \"training_path\": [\"vllm\", \"vllm._C_stable_libtorch\", \"flash_attn_2_cuda\", \"flash_attn.bert_padding\", \"verl\", \"verl.trainer.main_ppo\", \"verl.trainer.ppo.ray_trainer\", \"verl.trainer.ppo.v1.trainer_sync\", \"verl.trainer.ppo.v1.agent_loop_tq\", \"transfer_queue\", \"verl.workers.engine_workers\", \"verl.workers.engine.fsdp.transformer_impl\", \"verl.workers.config.model\", \"verl.workers.utils.losses\", \"verl.utils.dataset.rl_dataset\", \"verl.experimental.reward_loop\", \"verl.experimental.reward_loop.reward_manager.naive\", \"verl.utils.reward_score.gsm8k\", \"verl.experimental.agent_loop\", \"verl.experimental.agent_loop.single_turn_agent_loop\", \"verl.checkpoint_engine\", \"verl.workers.rollout.replica\", \"verl.workers.rollout.llm_server\", \"verl.workers.rollout.vllm_rollout.vllm_async_server\"], \"verl_version\": \"0.9.1\"}")
FLAGS = ("--json", "--quiet", "--smoke")
TORCH_FIX = ("reinstall {req} from {index} (pip install --force-reinstall --no-deps '{req}' "
             "--index-url {index}), or rebuild the image").format(req=EXPECTED["torch_requirement"],
                                                                   index=EXPECTED["torch_index"])
DRIVER_FIX = "run the container with --gpus all (NVIDIA Container Toolkit) and check nvidia-smi"
# compiled from source in the image's builder stage, never in requirements.txt: how to build each
BUILT = json.loads("{\"apex\": null, \"flash_attn\": \"FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTN_CUDA_ARCHS=90 pip install --no-build-isolation flash-attn==2.8.3\"}")


def first_line(exc):
    """`Type: message`, first non-empty line only (an ImportError's chain can run for pages)."""
    for line in f"{type(exc).__name__}: {exc}".splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


def cc_tuple(text):
    major, _, minor = str(text).partition(".")
    return int(major), int(minor or 0)


def version_tuple(text):
    return tuple(int(p) for p in str(text).split(".") if p.isdigit())


def arch_runs(cc, arch_list):
    """A cubin sm_XY runs on CC X.Z when Z >= Y; compute_XY (PTX) JIT-compiles for later GPUs."""
    major, minor = cc
    for arch in arch_list:
        kind, _, num = str(arch).partition("_")
        if not num.isdigit():
            continue
        a_major, a_minor = int(num[:-1]), int(num[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= tuple(cc):
            return True
    return False


class Report:
    def __init__(self):
        self.results = []

    def add(self, name, ok, detail, fix=""):
        self.results.append({"check": name, "ok": bool(ok), "detail": str(detail),
                             "fix": "" if ok else fix})

    def guard(self, name, fix, fn, *args):
        """fn(*args), or None with a failed check `name` when it raises anything."""
        try:
            return fn(*args)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # SystemExit from a module is a failure too, not an exit
            self.add(name, False, first_line(e), fix)
            return None


def load_torch(r):
    """torch, or None with the reason reported: missing, raising, or not PyTorch at all."""
    try:
        import torch
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        r.add("import torch", False, first_line(e), "torch is missing or broken: " + TORCH_FIX)
        return None
    where = getattr(torch, "__file__", None) or "(no file)"
    version = getattr(torch, "__version__", None)
    info = getattr(torch, "version", None)
    if info is None:
        try:
            info = importlib.import_module("torch.version")
        except KeyboardInterrupt:
            raise
        except BaseException:
            info = None
    if version is None or info is None or not hasattr(info, "cuda"):
        r.add("torch build", False, f"the torch at {where} is not a PyTorch build (no "
              "torch.__version__ or torch.version.cuda)",
              "a foreign or broken 'torch' shadows PyTorch: remove it and " + TORCH_FIX)
        return None
    base = str(version).split("+")[0]
    ok = str(info.cuda) == EXPECTED["torch_cuda"] and base == EXPECTED["torch_version"]
    r.add("torch build", ok, f"torch {version}, CUDA {info.cuda} (expected {EXPECTED['torch_version']} "
          f"for CUDA {EXPECTED['torch_cuda']})",
          "the image holds another torch than the one rendered: " + TORCH_FIX)
    return torch


def gpu_checks(r, torch):
    available = r.guard("GPU visible", DRIVER_FIX, torch.cuda.is_available)
    if available is None:
        return
    if not available:
        r.add("GPU visible", False, "no GPU visible (torch.cuda.is_available() is False)", DRIVER_FIX)
        return
    count = r.guard("GPU visible", DRIVER_FIX, torch.cuda.device_count)
    if count is None:
        return
    r.add("GPU visible", True, f"{count} device(s)")
    arch_list = r.guard("torch arch list", "torch's CUDA runtime is broken: " + TORCH_FIX,
                        torch.cuda.get_arch_list)
    for i in range(count):
        r.guard(f"GPU {i}", DRIVER_FIX, device_checks, r, torch, i, arch_list or [])
    r.guard("CUDA kernel runs", "the driver or torch build does not fit this GPU; see the checks "
            "above", kernel_check, r, torch)


def device_checks(r, torch, i, arch_list):
    name = torch.cuda.get_device_name(i)
    cc = tuple(torch.cuda.get_device_capability(i))
    cc_text = f"{cc[0]}.{cc[1]}"
    r.add(f"GPU {i} arch", arch_runs(cc, arch_list),
          f"{name}: CC {cc_text}; torch kernels: {' '.join(map(str, arch_list))}",
          f"this torch build has no kernels for sm_{cc[0]}{cc[1]} ('no kernel image is available'); "
          f"render a profile for this GPU (envbuild detect)")
    if cc_tuple(cc_text) != cc_tuple(EXPECTED["compute_capability"]):
        r.add(f"GPU {i} profile", cc_tuple(cc_text) >= cc_tuple(EXPECTED["compute_capability"])
              and arch_runs(cc, arch_list),
              f"image rendered for CC {EXPECTED['compute_capability']} ({EXPECTED['gpu']}), running on CC {cc_text}",
              "render the profile that matches this GPU (envbuild detect)")
    vram = r.guard(f"GPU {i} memory", DRIVER_FIX,
                   lambda: torch.cuda.get_device_properties(i).total_memory / 2**30)
    if vram is not None:
        r.add(f"GPU {i} memory", vram + 1 >= EXPECTED["model_vram_gb"],
              f"{vram:.0f} GiB for a model needing about {EXPECTED['model_vram_gb']} GiB",
              "use a smaller MODEL, more offload, or more GPUs")
    if EXPECTED["dtype"] == "bf16":
        bf16 = r.guard(f"GPU {i} bf16", "this GPU needs an fp16/fp32 profile", torch.cuda.is_bf16_supported)
        if bf16 is not None:
            r.add(f"GPU {i} bf16", bf16, "bf16 supported" if bf16 else "no native bf16",
                  "this GPU needs an fp16/fp32 profile")
    if EXPECTED["torch_compile"]:
        r.add(f"GPU {i} triton", cc_tuple(cc_text) >= (7, 0), f"CC {cc_text} (Triton needs 7.0)",
              "set TORCHDYNAMO_DISABLE=1")


def kernel_check(r, torch):
    t = torch.ones(4, device="cuda", dtype=getattr(torch, EXPECTED["torch_dtype"]))
    ok = float((t * 2).sum().item()) == 8.0
    r.add("CUDA kernel runs", ok, f"elementwise {EXPECTED['torch_dtype']} on device 0",
          "the driver or torch build does not fit this GPU; see the checks above")


def driver_version():
    try:
        import pynvml  # optional: nvidia-ml-py
        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        return driver.decode() if isinstance(driver, bytes) else str(driver)
    except Exception:
        pass
    import shutil
    import subprocess
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30)
    lines = out.stdout.strip().splitlines() if out.returncode == 0 else []
    return lines[0].strip() if lines else None


def driver_check(r):
    driver = r.guard("driver", DRIVER_FIX, driver_version)
    if not driver:
        return
    native = version_tuple(driver) >= version_tuple(EXPECTED["min_driver"])
    compat = version_tuple(driver) >= version_tuple(EXPECTED["compat_driver"])
    r.add("driver", compat, f"{driver} (CUDA {EXPECTED['driver_cuda']} needs >= {EXPECTED['min_driver']}"
          + ("" if native else f"; running under minor-version compatibility, >= {EXPECTED['compat_driver']}") + ")",
          f"upgrade the NVIDIA driver to >= {EXPECTED['min_driver']}")


def libcuda_for_imports(r):
    """Compiled modules may link libcuda.so.1 (vllm._C does), which only the driver provides.
    Without one, the CUDA image's forward-compat libcuda stands in, for loading modules only."""
    try:
        import ctypes
    except ImportError:  # a Python built without ctypes loads no compiled module through it either
        return
    try:
        ctypes.CDLL("libcuda.so.1")
        return
    except OSError:
        pass
    compat = EXPECTED["compat_libcuda"]
    if not os.path.exists(compat):
        return
    try:
        ctypes.CDLL(compat, mode=getattr(ctypes, "RTLD_GLOBAL", 0))
    except OSError as e:
        r.add("libcuda for imports", False, first_line(e), f"{compat} is broken; " + DRIVER_FIX)
        return
    r.add("libcuda for imports", True, f"no NVIDIA driver here: {compat} (the image's CUDA "
          "forward-compat library) stands in so that modules linked against libcuda load; GPU "
          "work still needs the driver")


def import_check(r, module):
    try:
        mod = importlib.import_module(module)
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        text = first_line(e)
        missing = getattr(e, "name", None) if isinstance(e, ModuleNotFoundError) else None
        if missing and BUILT.get(missing) and (module == missing or module.startswith(missing + ".")):
            fix = (f"{missing} is compiled from source for this GPU, not in requirements.txt: run "
                   f"this inside the envbuild image, or build it (needs nvcc): {BUILT[missing]}")
        elif missing and (module == missing or module.startswith(missing + ".")):
            fix = (f"{missing} is not installed here: run this inside the envbuild image, or install "
                   "the profile's requirements.txt")
        elif missing:
            fix = f"{module} needs {missing}, which is not installed: rebuild the image"
        elif "libcuda.so" in text:
            fix = f"{module} needs the NVIDIA driver's libcuda.so.1: " + DRIVER_FIX
        else:
            fix = (f"{module} is broken or was built against another torch/CUDA; rebuild the image "
                   "(training would stop at this import)")
        r.add(f"import {module}", False, text, fix)
        return
    version = getattr(mod, "__version__", None)
    r.add(f"import {module}", True, str(version) if isinstance(version, str) else "ok")


def patch_check(r):
    """verl patched for this GPU and audited, without importing verl: each recorded replacement of
    apply_patches.py in place in the installed release's files, then audit_precision.py (beside
    this file) run on them. A route without Docker that skipped them leaves a verl that computes
    in bf16 or imports flash-attn where this GPU cannot."""
    here = pathlib.Path(__file__).resolve().parent
    fix = f"run `{EXPECTED['finish']}` in {here} with this Python"
    spec = importlib.util.find_spec("verl")  # (finds verl; imports nothing)
    if spec is None or not spec.submodule_search_locations:
        r.add("verl patched", False, "verl is not installed", "install the profile's requirements first")
        return
    root = pathlib.Path(list(spec.submodule_search_locations)[0]).parent
    missing = []
    for patch in EXPECTED["patches"]:
        for rel in patch["files"]:
            path = root / rel
            text = path.read_text(errors="replace") if path.is_file() else None
            if text is None or any(new not in text or (find in text and find not in new)
                                   for find, new in patch["replace"]):
                missing.append(f"{patch['name']} ({rel})")
    if missing:
        r.add("verl patched", False, f"not applied in {root}: {', '.join(missing)}", fix)
    else:
        r.add("verl patched", True, f"{len(EXPECTED['patches'])} recorded patch(es) in place"
              if EXPECTED["patches"] else "no patch recorded for this GPU")
    audit = here / "audit_precision.py"
    if not audit.is_file():
        r.add("precision audit", False, f"{audit.name} is not beside {pathlib.Path(__file__).name}",
              "run preflight.py from the rendered folder (or the image's envbuild folder)")
        return
    p = subprocess.run([sys.executable, str(audit)], capture_output=True, text=True, timeout=300)
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    last = lines[-1] if lines else f"exit {p.returncode}"
    r.add("precision audit", p.returncode == 0, last, None if p.returncode == 0 else fix)


def checks(smoke):
    r = Report()
    torch = load_torch(r)
    if not smoke:
        if torch is None:
            r.add("GPU visible", False, "not checked: torch did not load", "fix torch first (above)")
        else:
            gpu_checks(r, torch)
        driver_check(r)
    r.guard("libcuda for imports", DRIVER_FIX, libcuda_for_imports, r)
    for module in EXPECTED["training_path"]:
        import_check(r, module)
    patch_check(r)
    return r.results


def config_keys():
    """(every key of verl's composed PPO config, the keys of its empty maps), composed as
    `python -m verl.trainer.main_ppo` composes it (hydra's compose API, the config its
    @hydra.main names)."""
    import re

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("verl is not installed")
    root = list(spec.submodule_search_locations)[0]
    with open(os.path.join(root, "trainer", "main_ppo.py"), encoding="utf-8") as f:
        found = re.search(r'@hydra\.main\(\s*config_path="([^"]+)",\s*config_name="([^"]+)"', f.read())
    if found is None:
        raise RuntimeError("verl/trainer/main_ppo.py names no @hydra.main config")
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    config_dir = os.path.normpath(os.path.join(root, "trainer", found.group(1)))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name=found.group(2))
    keys, open_maps = set(), set()

    def walk(node, prefix):
        for k, v in node.items():
            key = f"{prefix}{k}"
            keys.add(key)
            if isinstance(v, dict):
                if not v:
                    open_maps.add(key)
                walk(v, key + ".")

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    return keys, open_maps


def parsed_overrides(args):
    """[(prefix, key, value, arg)] of the run's overrides as Hydra itself parses them (its own
    override grammar: quotes, numbers, dicts, lists, sweeps), a dict set on a parent key spread
    into its leaves ({param_offload: true} on fsdp_config is fsdp_config.param_offload=True).
    A deletion (~key) is left out; an argument Hydra reads no override in is taken in its
    plain KEY=VALUE form, as text, if it has one (Hydra itself refuses the rest)."""
    import re

    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser
        parser = OverridesParser.create()
    except Exception:
        parser = None
    out = []
    for arg in args:
        o = None
        if parser is not None:
            try:
                (o,) = parser.parse_overrides([arg])
                value = o.value()
            except Exception:
                o = None
        if o is None:  # (no hydra here, or Hydra reads no override in it: the plain form, as text)
            found = re.match(r"^(\+{0,2})([A-Za-z_][A-Za-z0-9_.]*)=(.*)$", arg, re.S)
            if found:
                out.append((found.group(1), found.group(2), found.group(3), arg))
            continue
        if o.is_delete():
            continue
        prefix = "++" if o.is_force_add() else "+" if o.is_add() else ""
        values = list(value.list) if o.is_sweep_override() and hasattr(value, "list") else [value]
        for v in values:
            todo = [(o.key_or_group, v)]
            while todo:
                key, leaf = todo.pop()
                if isinstance(leaf, dict):
                    todo += [(f"{key}.{k}", x) for k, x in leaf.items()]
                out.append((prefix, key, leaf, arg))
    return out


def same_value(value, ref):
    """Whether `value` (as Hydra parsed it) is what the refused `ref` value ("true", "false",
    or a word) becomes in verl's config: a bool field takes 1, 'yes', "True" as True, as
    OmegaConf's BooleanNode converts them. An interpolation (${...}) is known only at run
    time, so it counts as the refused value."""
    if isinstance(value, str) and "${" in value:
        return True
    if isinstance(value, (dict, list)):
        return False
    if ref in ("true", "false"):
        try:
            from omegaconf import BooleanNode
            return BooleanNode(value=value)._value() is (ref == "true")
        except Exception:
            return str(value).strip().lower() in ({"true", "1", "yes", "on", "y"} if ref == "true"
                                                  else {"false", "0", "no", "off", "n"})
    return str(value).strip().lower() == ref


def override_problems(args):
    """[(what, fix)] for the run's extra Hydra overrides."""
    import difflib

    problems, added = [], []
    for prefix, key, value, arg in parsed_overrides(args):
        for ref in EXPECTED["refused_overrides"]:
            if key == ref["key"] and same_value(value, ref["value"]):
                problems.append((f"{arg}: {ref['why']}", ref["fix"]))
        if prefix and (prefix, key, arg) not in added and not isinstance(value, dict):
            added.append((prefix, key, arg))
    if added:
        try:
            keys, open_maps = config_keys()
        except Exception as e:
            return problems + [(f"verl's config could not be read to check {added[0][2]}: "
                                f"{first_line(e)}", "check that verl and hydra-core import in "
                                "this environment (preflight.py lists the imports)")]
        reads = set(EXPECTED["config_reads"])
        for prefix, key, arg in added:
            if key in keys or key in reads or any(key.startswith(m + ".") for m in open_maps):
                continue
            near = difflib.get_close_matches(key, sorted(keys | reads), n=1, cutoff=0.6)
            problems.append((f"{arg}: verl {EXPECTED['verl_version']}'s config has no key {key} and "
                             f"its code does not read one; Hydra's {prefix} would add it silently "
                             "and the run would go on without it",
                             (f"did you mean {near[0]}? " if near else "") + "set a key the config "
                             "has, without + (`python -m verl.trainer.main_ppo --cfg job` prints them)"))
    return problems


def stdout_to_stderr(fn):
    """fn() with file descriptor 1 pointed at stderr: packages that log to stdout on import
    (vLLM does) must not get into the report or break --json."""
    saved = None
    try:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(2, 1)
    except (OSError, ValueError, AttributeError):
        saved = None
    try:
        return fn()
    finally:
        if saved is not None:
            try:
                sys.stdout.flush()
            except Exception:
                pass
            os.dup2(saved, 1)
            os.close(saved)


def main(argv):
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return 0
    overrides = None
    if "--overrides" in argv:
        at = argv.index("--overrides")
        argv, overrides = argv[:at], argv[at + 1:]
    unknown = [a for a in argv if a not in FLAGS]
    if unknown:
        print(f"preflight.py: unknown argument {unknown[0]!r}; use {', '.join(FLAGS)} "
              "(--help says what each does)", file=sys.stderr)
        return 2
    smoke = "--smoke" in argv
    if overrides:
        refused = stdout_to_stderr(lambda: override_problems(overrides))
        if refused:
            for what, fix in refused:
                print(f"\u2717 run override {what}\n    fix: {fix}", file=sys.stderr)
            print(f"NOT STARTED: {len(refused)} run override(s) refused", file=sys.stderr)
            return 2
    results = stdout_to_stderr(lambda: checks(smoke))
    ready = all(r["ok"] for r in results)
    try:
        sys.stdout.reconfigure(errors="replace")  # a non-UTF-8 terminal gets '?' for the marks
    except Exception:
        pass
    if "--json" in argv:
        print(json.dumps({"profile": EXPECTED["profile"], "ready": ready,
                          "mode": "smoke" if smoke else "full", "checks": results}, indent=2))
    elif not ("--quiet" in argv and ready):
        for r in results:
            mark = "\u2713" if r["ok"] else "\u2717"
            print(f"{mark} {r['check']}: {r['detail']}" + (f"\n    fix: {r['fix']}" if r["fix"] else ""))
        if smoke:
            n = len(EXPECTED["training_path"])
            print(("smoke ok" if ready else "smoke FAILED") + f": {EXPECTED['profile']} (torch build and "
                  f"{n} modules of the training path; no GPU checks)")
        else:
            print(("READY" if ready else "NOT READY") + f": profile {EXPECTED['profile']} on this machine")
    return 0 if ready else 1


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except KeyboardInterrupt:
        code = 130
    except BaseException as e:  # the last guard: a report that cannot be printed is still an answer
        try:
            print(f"\u2717 preflight itself failed: {first_line(e)}", file=sys.stderr)
        except BaseException:
            pass
        code = 1
    sys.exit(code)
