"""The resolved environment, typed: what the resolver decided, what every template, the lock,
the wheelhouse, build and doctor read, and what envbuild.json holds.

Frozen records (record.py): fields by name, nested records, tuples for lists, read-only mappings
for the maps (pins, images, the memory plan). Nothing changes an environment in place: a mirror
(mirrors.apply_to_env) or a lock's constraints (plan.with_constraints) give a new one.

The shape lives here, the kind of every value (name, version, URL, one line of text) in
matrix_schema.RESOLVED, the spec `from_dict` checks a file against; a test holds the two to the
same fields, and every object of the spec to a record or a read-only map
(tests/test_resolved.py).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from envbuilder.errors import UserError
from envbuilder.model.record import Record

SCHEMA_VERSION = 1
FROM_FIX = (
    "Pass the envbuild.json that `envbuild render` wrote, unedited, or re-resolve the "
    "profile (envbuild render PROFILE)."
)


class Overrides(Record):
    """What the user asked to change about a profile (CLI flags)."""

    __slots__ = _fields = (
        "cuda",
        "torch",
        "python",
        "verl",
        "rollout",
        "vllm",
        "with_",
        "without",
        "driver",
        "allow_unsupported",
        "ecc",
        "model",
        "model_arch",
        "algo",
        "nodes",
        "gpus_per_node",
        "interconnect",
    )
    _defaults = {
        "cuda": None,
        "torch": None,
        "python": None,
        "verl": None,
        "rollout": None,
        "vllm": None,
        "with_": (),
        "without": (),
        "driver": None,
        "allow_unsupported": False,
        "ecc": None,
        "model": None,
        "model_arch": None,
        "algo": None,
        "nodes": None,
        "gpus_per_node": None,
        "interconnect": None,
    }
    _keys = {"with_": "with"}
    # model_arch: the shape --model's config.json gave (architectures.with_model), for a model
    # the table lacks; derived from `model`, so never a flag of its own
    _derived = ("model_arch",)

    def to_dict(self) -> dict:
        """The flags given, by their names (`with`), sorted; what was left at its default is
        left out."""
        d = {
            self._keys.get(k, k): v
            for k, v in self._asdict().items()
            if v not in (None, (), False) and k not in self._derived
        }
        return {k: list(v) if isinstance(v, tuple) else v for k, v in sorted(d.items())}


class Gpu(Record):
    """key: the matrix's name of the GPU; sm: the compute capability without the dot."""

    __slots__ = _fields = (
        "key",
        "name",
        "arch",
        "compute_capability",
        "sm",
        "vram_gb",
        "bf16",
        "max_smem_per_block_kb",
    )


class Cuda(Record):
    """version: major.minor (the image's); images: role (devel, runtime) -> image reference."""

    __slots__ = _fields = (
        "version",
        "full_version",
        "ubuntu",
        "glibc",
        "images",
        "conda_nvcc",
        "compat_libcuda",
    )


class Driver(Record):
    """The driver the image needs (for_cuda: its CUDA, or the vLLM wheel's if newer); with
    --driver, that driver and how it runs the image (mode: native, minor-version-compatibility,
    too-old)."""

    __slots__ = _fields = ("min_driver", "compat_driver", "for_cuda", "mode", "driver")
    _defaults = {"mode": None, "driver": None}
    _omit_none = ("mode", "driver")


class Torch(Record):
    """variant: the build (cu118, cu124, ...); index_url: the PyTorch index of a +cuXXX build,
    None for PyPI's; packages: the torch, torchvision, torchaudio requirements."""

    __slots__ = _fields = ("version", "variant", "cuda", "archs", "index_url", "packages")


class Vllm(Record):
    __slots__ = _fields = ("version", "torch", "wheel_cuda")


class Sglang(Record):
    """The SGLang release of the sglang rollout: its torch pin, the requirement its install
    layer asks for (with verl's extras) and the kernel wheel it pins."""

    __slots__ = _fields = ("version", "torch", "requirement", "kernel")


class RefusedOverride(Record):
    """A run override (KEY=VALUE on the run script's command line) preflight refuses: why, fix."""

    __slots__ = _fields = ("key", "value", "why", "fix")


class Verl(Record):
    """autocast_keys: part -> the Hydra key of its autocast dtype; pins: package -> version;
    config_reads: keys the release reads that its config file lacks (only `+`/`++` sets them);
    lora_orig_params_key: the key the run script sets True for LoRA on the HF rollout (None
    where not needed); refused_overrides: what preflight refuses on the run's command line."""

    __slots__ = _fields = (
        "version",
        "attention_override",
        "autocast_keys",
        "pins",
        "config_reads",
        "lora_orig_params_key",
        "refused_overrides",
        "rollout_mode",
        "critic_fsdp",
    )
    _defaults = {
        "config_reads": (),
        "lora_orig_params_key": None,
        "refused_overrides": (),
        "rollout_mode": "sync",
        "critic_fsdp": "critic.model.fsdp_config",
    }
    _nested = {"refused_overrides": (RefusedOverride,)}


class Precision(Record):
    """The dtype each part of a PPO run computes in (bf16, fp16, fp32)."""

    __slots__ = _fields = ("actor", "critic", "ref", "rollout")


class Features(Record):
    __slots__ = _fields = ("bf16", "flash_attention", "remove_padding", "torch_compile")


class FlashAttn(Record):
    """release: the download folder of its prebuilt wheels; wheel: their file name template;
    cuda_tags: CUDA major -> the wheel's tag (flash_attn_wheel.py names the file)."""

    __slots__ = _fields = ("version", "modules", "release", "wheel", "cuda_tags")


class Apex(Record):
    """install: how its CUDA extensions are asked for (env or config_settings)."""

    __slots__ = _fields = ("version", "ref", "install", "url", "arch_list", "modules")


class Patch(Record):
    """A patch of verl's source: replace is a tuple of {"find", "with"} (source text)."""

    __slots__ = _fields = ("name", "why", "files", "replace")


class Reviewed(Record):
    """A reviewed exception of the precision audit: `line` in `file` is fine because `why`,
    as long as the run script's values `holds`."""

    __slots__ = _fields = ("name", "check", "file", "line", "why", "holds")


class Audit(Record):
    __slots__ = _fields = ("checks", "reviewed")
    _nested = {"reviewed": (Reviewed,)}


class AllocConf(Record):
    """PYTORCH_CUDA_ALLOC_CONF for a small GPU: value (None where the rollout refuses it), why."""

    __slots__ = _fields = ("value", "why")


class Indexes(Record):
    """pypi: the package index; torch: the PyTorch index of a +cuXXX build (None: PyPI's)."""

    __slots__ = _fields = ("pypi", "torch")


class Uv(Record):
    """The uv wheel the runtime stage's pip steps install with, pinned by sha256."""

    __slots__ = _fields = ("version", "url", "sha256", "size")

    @property
    def filename(self) -> str:
        """The wheel's file name (the last part of its URL), as indexes and wheelhouses list it."""
        return self.url.rsplit("/", 1)[-1]


class Train(Record):
    """The PPO run's settings (the profile's `train`); micro_batch_size_per_gpu: an upper bound
    on every planned micro-batch, None for none."""

    __slots__ = _fields = (
        "model",
        "model_vram_gb",
        "n_gpus",
        "train_batch_size",
        "ppo_mini_batch_size",
        "micro_batch_size_per_gpu",
        "max_prompt_length",
        "max_response_length",
        "param_offload",
        "optimizer_offload",
        "gradient_checkpointing",
        "gpu_memory_utilization",
        "lora_rank",
        "actor_param_offload",
        "actor_model_dtype",
    )
    _defaults = {"micro_batch_size_per_gpu": None, "actor_model_dtype": None}
    _omit_none = ("micro_batch_size_per_gpu", "actor_model_dtype")


class Algorithm(Record):
    """verl's advantage estimator and what the run takes of it (algorithms.yaml): a critic
    (gae only), `n` responses per prompt (above 1 where it normalises over the group), where
    the KL to the reference goes (`loss`, `reward` or `none`), extra run keys, and one more
    greedy rollout per prompt (ReMax)."""

    __slots__ = _fields = (
        "name",
        "critic",
        "group",
        "n",
        "kl",
        "kl_loss_type",
        "kl_loss_coef",
        "extra",
        "extra_generation",
    )


class Cluster(Record):
    """Where the run's GPUs are: `nodes` machines of `gpus_per_node` each, how they talk
    (interconnects.yaml: None for one GPU), the NCCL/Gloo variables the run script exports
    unless set, and whether it names the bootstrap interface (NCCL_SOCKET_IFNAME,
    GLOO_SOCKET_IFNAME) from the default route."""

    __slots__ = _fields = ("nodes", "gpus_per_node", "interconnect", "env", "interface")


class Dataset(Record):
    """files: split -> file in the repo; rows: split -> row count."""

    __slots__ = _fields = (
        "name",
        "repo",
        "revision",
        "files",
        "data_source",
        "ability",
        "instruction",
        "answer_pattern",
        "rows",
        "source",
    )


class Constraints(Record):
    """The pins of the lock that fits the environment's install plan (plan.with_constraints):
    from_: which lock; torch_swapped: solved with PyPI's torch ('2.6.0+cu118 -> 2.6.0 ...');
    layers: install layer -> name==version pins."""

    __slots__ = _fields = ("from_", "torch_swapped", "plan_sha256", "layers")
    _keys = {"from_": "from"}


class Mirror(Record):
    """The mirror set the endpoints were rewritten to (mirrors.apply_to_env)."""

    __slots__ = _fields = ("name", "apt", "conda_nvidia")


class ResolvedEnv(Record):
    """Everything the templates need. JSON round-trips to the same bytes.

    memory: the memory plan (envbuilder/model/memory.py: peak, usable_gib, batch sizes, the budget
    term by term) as read-only data; warnings: what --allow-unsupported let through;
    constraints: None until plan.with_constraints looked for a lock (and when none fits);
    mirror: None unless a mirror set was applied."""

    __slots__ = _fields = (
        "schema_version",
        "envbuild_version",
        "profile",
        "description",
        "overrides",
        "gpu",
        "cuda",
        "driver",
        "python",
        "torch",
        "rollout",
        "vllm",
        "sglang",
        "verl",
        "dtype",
        "precision",
        "attention",
        "features",
        "flash_attn",
        "apex",
        "patches",
        "audit",
        "cuda_alloc_conf",
        "indexes",
        "uv",
        "huggingface",
        "conda_channels",
        "train",
        "algorithm",
        "cluster",
        "notes",
        "dataset",
        "training_path",
        "memory",
        "warnings",
        "constraints",
        "mirror",
    )
    _defaults = {"constraints": None, "mirror": None, "notes": (), "sglang": None}
    _omit_none = ("mirror", "sglang")
    _nested = {
        "overrides": Overrides,
        "gpu": Gpu,
        "cuda": Cuda,
        "driver": Driver,
        "torch": Torch,
        "vllm": Vllm,
        "sglang": Sglang,
        "verl": Verl,
        "precision": Precision,
        "features": Features,
        "flash_attn": FlashAttn,
        "apex": Apex,
        "patches": (Patch,),
        "audit": Audit,
        "cuda_alloc_conf": AllocConf,
        "indexes": Indexes,
        "uv": Uv,
        "train": Train,
        "algorithm": Algorithm,
        "cluster": Cluster,
        "dataset": Dataset,
        "constraints": Constraints,
        "mirror": Mirror,
    }

    @property
    def name(self) -> str:
        return self.profile

    @property
    def needs_builder(self) -> bool:
        """A builder stage compiles or fetches extensions (apex, flash-attn) against the torch."""
        return bool(self.apex or self.flash_attn)

    def to_json(self, d: dict | None = None) -> str:
        """envbuild.json's text: indented, sorted. json's indenting encoder is pure Python (a
        third of `render --all`), so the text is kept in the cache folder by the sha256 of the
        compact form (C-encoded) and used only when it reads back as this environment: its own
        compact form is this one's, byte for byte."""
        from envbuilder.paths import cache_file, read_sealed, write_sealed

        d = self.to_dict() if d is None else d  # (d: this environment's to_dict(), if at hand)
        compact = json.dumps(d, sort_keys=True, separators=(",", ":"))
        path = cache_file(f"env-{hashlib.sha256(compact.encode()).hexdigest()[:32]}.json")
        # sealed (paths.read_sealed): this envbuild wrote it from this very compact form
        text = read_sealed(path)
        if text is not None:
            return text
        text = json.dumps(d, indent=2, sort_keys=True) + "\n"
        write_sealed(path, text)
        return text

    @classmethod
    def from_json(cls, text: str, origin: str = "envbuild.json") -> "ResolvedEnv":
        """The environment a file holds (JSON), read by the one bounded reader (readers.py: no
        NaN, no number of hundreds of digits, no key twice, nested at most a few levels) and
        checked as from_dict checks it."""
        from envbuilder.readers import parse_json

        return cls.from_dict(parse_json(text, origin, fix=FROM_FIX), origin)

    @classmethod
    def from_dict(cls, data: Any, origin: str = "envbuild.json") -> "ResolvedEnv":
        """The environment of plain data from outside (a file, an image's /etc/envbuild.json).
        Every value is checked against the kind of the matrix field it came from
        (matrix_schema.RESOLVED: names, versions, URLs, model ids, pins, one-line text) and the
        shape against the fields here, all problems named at once: an edited or foreign file
        reaches no template with a value the matrix would refuse (UserError, exit 2)."""
        from envbuilder.model import schema as S
        from envbuilder.model.matrix_schema import RESOLVED
        from envbuilder.readers import check_tree

        check_tree(data, origin, FROM_FIX)  # (depth, lengths, finite numbers: data from outside)
        if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
            raise UserError(
                f"{origin} is not an envbuild resolved environment of schema version "
                f"{SCHEMA_VERSION}. Pass the envbuild.json that `envbuild render` wrote "
                "(or re-resolve it from its profile)."
            )
        try:
            S.check(data, RESOLVED, f"{origin}: ", partial=True)
        except S.SchemaError as e:
            raise UserError(
                f"{e}. It is not a value envbuild writes there; pass the envbuild.json "
                "that `envbuild render` wrote, unedited, or re-resolve the profile "
                "(envbuild render PROFILE)."
            ) from None
        problems = shape_problems(data)
        if problems:
            profile = data["profile"] if isinstance(data.get("profile"), str) else "PROFILE"
            raise UserError(
                f"{origin} is not an envbuild resolved environment as this envbuild "
                f"writes it: {'; '.join(problems[:5])}"
                + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else "")
                + ". Pass the envbuild.json that `envbuild render` wrote, unedited, or "
                f"re-resolve it: envbuild render {profile} with the same overrides "
                "(they are under `overrides` in the file)."
            )
        return cls.from_plain(data)


def shape_problems(data: dict) -> list[str]:
    """Where plain data (read from a file) differs in shape from the resolved environment's
    field spec (matrix_schema.RESOLVED): every required key that is missing, every value of
    another kind (a number in a list of names too), all at once."""
    from envbuilder.model import schema as S
    from envbuilder.model.matrix_schema import RESOLVED

    kinds = {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "true/false",
        int: "a number",
        float: "a number",
    }

    def want(spec) -> set[str]:
        if isinstance(spec, tuple):
            return want(spec[0])
        if isinstance(spec, (dict, S.MapOf, S.Tree)):
            return {"an object"}
        if isinstance(spec, S.ListOf):
            return {"a list"}
        if spec in (int, float) or isinstance(spec, (S.Int, S.Num)):
            return {"a number"}
        if spec is bool:
            return {"true/false"}
        if isinstance(spec, S.Scalar):
            return {"a string", "a number", "true/false"}
        if isinstance(spec, S.OneOf):
            return {kinds.get(type(c), "a string") for c in spec.choices}
        return {"a string"}  # (the text kinds)

    def value(v, spec, where: str) -> list[str]:
        if v is None:
            return []
        got = kinds.get(type(v), type(v).__name__)
        wanted = want(spec)
        if got not in wanted:
            return [f"{where} is {got}, not {' or '.join(sorted(wanted))}"]
        inner = spec[0] if isinstance(spec, tuple) else spec
        if isinstance(inner, dict):
            return walk(v, inner, f"{where}.")
        if isinstance(inner, S.ListOf):
            return [p for i, item in enumerate(v) for p in value(item, inner.item, f"{where}[{i}]")]
        if isinstance(inner, S.MapOf):
            return [p for k, item in v.items() for p in value(item, inner.value, f"{where}.{k}")]
        return []

    def walk(data: dict, spec: dict, where: str) -> list[str]:
        out = []
        for key, sub in spec.items():
            if key == "*":
                continue
            name = key.rstrip("?")
            if name not in data:
                if not key.endswith("?"):
                    out.append(f"{where}{name} is missing")
                continue
            out += value(data[name], sub, f"{where}{name}")
        return out

    return walk(data, RESOLVED, "")
