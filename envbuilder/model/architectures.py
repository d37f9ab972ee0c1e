"""`--model`: the shape of the model a user trains, from the recorded table, a local folder's
config.json, or the hub's config.json through a Hugging Face endpoint (a mirror's).

The memory plan needs a decoder's shape (matrices/models.yaml's fields); a model's own
config.json holds it under transformers' names. Only dense decoders of the families the plan
models are taken: a mixture-of-experts or another layout is refused with the reason, never
estimated with the wrong formula.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING

from envbuilder.errors import UserError
from envbuilder.text import redact

if TYPE_CHECKING:
    from envbuilder.model.matrix import Matrix

# model_type -> (family, q/k/v bias, q/k RMSNorm per head): transformers' Qwen2Attention has a
# bias on q, k and v; LlamaAttention and MistralAttention take `attention_bias` (default off);
# Qwen3Attention adds q_norm and k_norm (one RMSNorm of head_dim each) and no bias.
FAMILIES = {
    "qwen2": ("qwen2", True, False),
    "llama": ("llama", False, False),
    "mistral": ("llama", False, False),
    "qwen3": ("qwen3", False, True),
}
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")
# mixtures of experts the plan counts (verl 0.9.1 trains Qwen3-MoE on the FSDP engine: its
# examples/gmpo_trainer/test_dapo_qwen3_30b_math.sh): every layer's MLP is num_experts experts of
# moe_intermediate_size and a router, num_experts_per_tok of them run for each token
MOE_FAMILIES = {"qwen3_moe": ("qwen3", False, True)}
# DeepSeek-style mixtures (verl trains them on its Megatron engine: examples/grpo_trainer/
# run_deepseek671b_math_megatron_80gb.sh, run_moonlight16b_a3b_gsm8k_megatron.sh): MLA attention,
# routed and shared experts, the first first_k_dense_replace layers dense (transformers'
# modeling_deepseek_v3.py)
DEEPSEEK = ("deepseek_v2", "deepseek_v3")
MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few KB; an endpoint that sends more is refused
DEFAULT_HF = "https://huggingface.co"
_LOCAL = re.compile(r"/(?!.*(?:\.\.|//))[A-Za-z0-9_.+/-]{1,200}")


def is_local(name: str) -> bool:
    """A --model that names a folder (a path) rather than a hub repo id."""
    return name.startswith(("/", "./", "../", "~")) or name in (".", "..")


# a models.yaml record (matrix_schema.MODEL), as the plan reads it
ModelRecord = dict[str, object]


def _positive(cfg: Mapping[str, object], key: str, origin: str, default: object = None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 10**7:
        raise UserError(
            f"{origin}: `{key}` is {value!r}, not a positive whole number below 10^7, "
            "so the model's shape is unknown. Check that this is the model's own "
            "config.json (transformers writes it next to the weights)."
        )
    return value


def _moe_arch(cfg: Mapping[str, object], origin: str, name: str, kind: str) -> ModelRecord:
    """A Qwen3-MoE's record: the dense fields with the experts' (every layer a sparse one)."""
    sparse_step = cfg.get("decoder_sparse_step", 1)
    if sparse_step != 1 or cfg.get("mlp_only_layers"):
        raise UserError(
            f"{name} ({origin}) mixes dense and expert layers (decoder_sparse_step "
            f"{sparse_step!r}, mlp_only_layers {cfg.get('mlp_only_layers')!r}); the plan counts a "
            "Qwen3-MoE whose every layer is a mixture of experts. Plan this one by hand."
        )
    experts = _positive(cfg, "num_experts", origin)
    per_token = _positive(cfg, "num_experts_per_tok", origin)
    if per_token > experts:
        raise UserError(f"{origin}: num_experts_per_tok {per_token} is more than num_experts {experts}.")
    dense = dict(cfg, model_type=MOE_FAMILIES[kind][0])
    for k in MOE_KEYS:
        dense.pop(k, None)
    rec = arch_from_config(dense, origin, name)
    rec.update(experts=experts, experts_per_token=per_token)
    rec["moe_intermediate_size"] = _positive(cfg, "moe_intermediate_size", origin)
    from envbuilder.model.arch import Arch

    rec["parameters"] = Arch(name, rec).params()
    return dict(rec, source=origin)


def _deepseek_arch(cfg: Mapping[str, object], origin: str, name: str) -> ModelRecord:
    """A DeepSeek-V2/V3-style record: MLA attention (a q_lora_rank bottleneck or none, one
    kv_lora_rank latent and a rope part for keys and values), n_routed_experts experts and
    n_shared_experts shared ones of moe_intermediate_size in every layer from
    first_k_dense_replace on, a dense MLP of intermediate_size before."""
    from envbuilder.model.arch import Arch

    freq = cfg.get("moe_layer_freq", 1)
    if freq != 1:
        raise UserError(
            f"{name} ({origin}) has an expert layer every {freq!r} layers (moe_layer_freq); the plan "
            "counts DeepSeek-style models whose layers from first_k_dense_replace on are all experts. "
            "Plan this one by hand."
        )
    heads = _positive(cfg, "num_attention_heads", origin)
    nope = _positive(cfg, "qk_nope_head_dim", origin)
    rope = _positive(cfg, "qk_rope_head_dim", origin)
    q_lora = cfg.get("q_lora_rank") or 0
    if q_lora:
        q_lora = _positive(cfg, "q_lora_rank", origin)
    experts = _positive(cfg, "n_routed_experts", origin)
    per_token = _positive(cfg, "num_experts_per_tok", origin)
    if per_token > experts:
        raise UserError(f"{origin}: num_experts_per_tok {per_token} is more than n_routed_experts {experts}.")
    layers = _positive(cfg, "num_hidden_layers", origin)
    dense = cfg.get("first_k_dense_replace", 0)
    if isinstance(dense, bool) or not isinstance(dense, int) or not 0 <= dense < layers:
        raise UserError(f"{origin}: first_k_dense_replace {dense!r} is not a layer count below {layers}.")
    shared = cfg.get("n_shared_experts") or 0
    if shared:
        shared = _positive(cfg, "n_shared_experts", origin)
    tied = cfg.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise UserError(f"{origin}: tie_word_embeddings must be true or false.")
    rec: ModelRecord = {
        "family": "deepseek",
        "layers": layers,
        "hidden_size": _positive(cfg, "hidden_size", origin),
        "attention_heads": heads,
        "kv_heads": heads,  # (MLA: every head has its own keys and values, from one latent)
        "head_dim": nope + rope,
        "intermediate_size": _positive(cfg, "intermediate_size", origin),
        "vocab_size": _positive(cfg, "vocab_size", origin),
        "tied_embeddings": tied,
        "qkv_bias": False,
        "max_position_embeddings": _positive(cfg, "max_position_embeddings", origin),
        "experts": experts,
        "experts_per_token": per_token,
        "moe_intermediate_size": _positive(cfg, "moe_intermediate_size", origin),
        **({"shared_experts": shared} if shared else {}),
        **({"dense_layers": dense} if dense else {}),
        **({"router_bias": True} if cfg.get("model_type") == "deepseek_v3" else {}),
        "mla": {
            "q_lora_rank": q_lora,
            "kv_lora_rank": _positive(cfg, "kv_lora_rank", origin),
            "qk_rope_head_dim": rope,
            "v_head_dim": _positive(cfg, "v_head_dim", origin),
        },
    }
    rec["parameters"] = Arch(name, rec).params()
    rec["source"] = origin
    return rec


def arch_from_config(cfg: object, origin: str, name: str) -> ModelRecord:
    """A models.yaml record from a transformers config.json (its parameter count computed)."""
    if not isinstance(cfg, dict):
        raise UserError(
            f"{origin} is not a config.json: it holds {type(cfg).__name__}, where "
            "transformers writes an object of the model's settings."
        )
    return _dense_arch(cfg, origin, name)


def _dense_arch(cfg: Mapping[str, object], origin: str, name: str) -> ModelRecord:
    """arch_from_config's, for a config.json's object."""
    from envbuilder.model.arch import Arch

    kind = cfg.get("model_type")
    moe = [k for k in MOE_KEYS if cfg.get(k)]
    if kind in DEEPSEEK:
        return _deepseek_arch(cfg, origin, name)
    if moe and isinstance(kind, str) and kind in MOE_FAMILIES:
        return _moe_arch(cfg, origin, name, kind)
    if moe:
        raise UserError(
            f"{name} is a mixture-of-experts model ({origin} sets {', '.join(moe)}): "
            "the memory plan models dense decoders and Qwen3-MoE only, and this expert layout needs "
            "other sums. Pick a dense model or a Qwen3-MoE, or plan this one by hand and render a "
            "profile whose train block you size yourself."
        )
    if not isinstance(kind, str) or kind not in FAMILIES:  # (a list or an object is no model type)
        from envbuilder.text import shorten

        raise UserError(
            f"{name} is a {shorten(repr(kind), 60)} model ({origin}); the memory plan knows the "
            f"layouts {', '.join(sorted(FAMILIES))} (dense decoders with a gated MLP "
            "and RMSNorm). Pick a model of one of them."
        )
    family, bias, qk_norm = FAMILIES[kind]
    layers = _positive(cfg, "num_hidden_layers", origin)
    hidden = _positive(cfg, "hidden_size", origin)
    heads = _positive(cfg, "num_attention_heads", origin)
    kv = _positive(cfg, "num_key_value_heads", origin, heads)
    head_dim: object = cfg.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise UserError(
                f"{origin}: hidden_size {hidden} is not a multiple of "
                f"num_attention_heads {heads} and no head_dim is given."
            )
        head_dim = hidden // heads
    head_dim = _positive({"head_dim": head_dim}, "head_dim", origin)
    if heads % kv:
        raise UserError(
            f"{origin}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}."
        )
    tied = cfg.get("tie_word_embeddings", False)
    attention_bias = cfg.get("attention_bias", False)
    if not isinstance(tied, bool) or not isinstance(attention_bias, bool):
        raise UserError(f"{origin}: tie_word_embeddings and attention_bias must be true or false.")
    rec: ModelRecord = {
        "family": family,
        "layers": layers,
        "hidden_size": hidden,
        "attention_heads": heads,
        "kv_heads": kv,
        "head_dim": head_dim,
        "intermediate_size": _positive(cfg, "intermediate_size", origin),
        "vocab_size": _positive(cfg, "vocab_size", origin),
        "tied_embeddings": tied,
        "qkv_bias": bias or attention_bias,
        "max_position_embeddings": _positive(cfg, "max_position_embeddings", origin),
        **({"qk_norm": True} if qk_norm else {}),
    }
    rec["parameters"] = Arch(name, rec).params()
    rec["source"] = origin
    return rec


def _parse(data: bytes, origin: str) -> object:
    try:
        doc: object = json.loads(data.decode("utf-8"))
        return doc
    except (ValueError, RecursionError) as e:  # (UnicodeDecodeError is a ValueError)
        raise UserError(
            f"{origin} is not a readable config.json ({str(e)[:120]}). Check that "
            "it is the model's own config.json."
        ) from None


def local_config(folder: str) -> tuple[str, ModelRecord]:
    """(the folder as an absolute path, its shape) for a --model that is a folder."""
    from envbuilder.limits import read_text_bounded

    path = Path(os.path.expanduser(folder)).resolve()
    key = str(path)
    if not path.is_dir():
        raise UserError(
            f"--model {folder}: no such folder. Pass a hub repo id "
            "(Qwen/Qwen2.5-7B-Instruct) or a folder that holds the model's "
            "config.json."
        )
    if not _LOCAL.fullmatch(key):
        raise UserError(
            f"--model {folder}: the folder's path {key!r} has characters the run "
            "script cannot name safely (letters, digits, '.', '_', '+', '-', '/')."
        )
    config = path / "config.json"
    if not config.is_file():
        raise UserError(
            f"--model {folder}: the folder has no config.json, so the model's shape "
            "is unknown. Point at the folder transformers saved the model in."
        )
    text = read_text_bounded(config, "the model's config.json", MAX_CONFIG_BYTES)
    return key, arch_from_config(_parse(text.encode(), str(config)), str(config), key)


def hf_endpoint() -> str:
    """HF_ENDPOINT (huggingface_hub's own variable, a mirror's), else the hub."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_HF).rstrip("/")


def hub_config(repo: str, endpoint: str | None = None, timeout: float = 10.0) -> ModelRecord:
    """The shape of hub model `repo` from its config.json at ENDPOINT/REPO/resolve/main/, kept
    in envbuild's cache (sealed, paths.read_sealed: read back only when this user's envbuild
    wrote it; validated again on every read) so a render after the first is offline."""
    from envbuilder.paths import cache_file, read_sealed, write_sealed

    endpoint = (endpoint or hf_endpoint()).rstrip("/")
    url = f"{endpoint}/{repo}/resolve/main/config.json"
    shown = redact(url)
    key = hashlib.sha256(url.encode()).hexdigest()[:32]
    cached = read_sealed(cache_file(f"hf-config-{key}.json"))
    if cached is not None:
        try:
            return arch_from_config(_parse(cached.encode(), shown), shown, repo)
        except UserError:
            pass  # a cache entry that no longer reads is fetched afresh
    if os.environ.get("ENVBUILD_OFFLINE") or os.environ.get("HF_HUB_OFFLINE") == "1":
        raise UserError(
            f"{repo} is not in the model table and its config.json is not cached, "
            "and this run is offline (ENVBUILD_OFFLINE / HF_HUB_OFFLINE). Pass the "
            "folder that holds the model (--model /path/to/model), or run once "
            "online."
        )
    from envbuilder.oci.hub import fetch_config

    data = fetch_config(url, shown, repo, timeout, MAX_CONFIG_BYTES)
    rec = arch_from_config(_parse(data, shown), shown, repo)
    write_sealed(cache_file(f"hf-config-{key}.json"), data.decode("utf-8", errors="replace"))
    return rec


def with_model(m: Matrix, name: str | None, hub: str | None = None) -> tuple[Matrix, str | None]:
    """`m` with --model NAME's shape in its model table: (matrix, the table's key of the model).
    A name the table has is taken from it; a folder from its config.json; any other repo id
    from the hub (`hub`: a mirror set's Hugging Face endpoint, else HF_ENDPOINT). None: (m, None); an empty name is refused (it would mean no model silently)."""
    if name is None:
        return m, None
    if not name.strip():
        raise UserError("--model is empty. Give a hub repo id or a folder, or leave --model out.")
    if name in m.models:
        return m, name
    if is_local(name):
        key, rec = local_config(name)
    else:
        from envbuilder.model import schema as S

        try:
            S.check(name, S.MODEL_ID, "--model")
        except S.SchemaError as e:
            raise UserError(
                f"--model {name!r}: {e}. Pass a hub repo id like "
                "Qwen/Qwen2.5-7B-Instruct or a folder (./my-model)."
            ) from None
        key, rec = name, hub_config(name, hub)
    sections = dict(m.sections, models={**m.models, key: rec})
    return type(m)(sections, {**m.origin, ("models", key): str(rec["source"])}), key


def scaled_vram_gb(profile_gb: float, profile_params: int, params: int) -> float:
    """The profile's "about N GiB" for its model, scaled to another model by parameters."""
    return float(max(1, math.ceil(profile_gb * params / profile_params)))
