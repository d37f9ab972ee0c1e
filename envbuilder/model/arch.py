"""A decoder's shape (a matrices/models.yaml record) and the parameter counts that follow from
it: what the memory plan (memory.py) and the Megatron layout (megatron.py) both read."""

from __future__ import annotations

from collections.abc import Mapping


def _n(rec: Mapping[str, object], key: str, default: int | None = None) -> int:
    """A whole number of a models.yaml record (`default` where the key is absent)."""
    value = rec.get(key, default)
    if not isinstance(value, int):
        raise TypeError(f"{key}: {value!r} is not a whole number")
    return value


class Arch:
    """A decoder's shape (a models.yaml record) and the parameter counts that follow from it:
    L layers, H hidden size, a attention heads, k KV heads, d head dim, I intermediate size,
    V vocabulary; a mixture of experts (Qwen3-MoE): E experts of intermediate size Ie in every
    layer's MLP, with a router, `topk` of them run for each token. Weights, gradients and Adam
    state count every expert; activations and compute count the experts a token runs."""

    name: str
    L: int
    H: int
    a: int
    k: int
    d: int
    I: int
    V: int
    tied: bool
    bias: bool
    qk_norm: bool

    def __init__(self, name: str, rec: Mapping[str, object]):
        self.name = name
        self.L, self.H = _n(rec, "layers"), _n(rec, "hidden_size")
        self.a, self.k, self.d = _n(rec, "attention_heads"), _n(rec, "kv_heads"), _n(rec, "head_dim")
        self.I, self.V = _n(rec, "intermediate_size"), _n(rec, "vocab_size")
        self.tied, self.bias = bool(rec["tied_embeddings"]), bool(rec["qkv_bias"])
        self.qk_norm = bool(rec.get("qk_norm", False))  # Qwen3: an RMSNorm of head_dim on q and on k
        self.E = _n(rec, "experts", 0)
        self.topk = _n(rec, "experts_per_token", 0)
        self.Ie = _n(rec, "moe_intermediate_size", 0)
        # DeepSeek-style: shared experts beside the routed ones (each of Ie, run for every
        # token), the first `dense_layers` layers a dense MLP of I, and MLA attention (queries
        # through a q_lora_rank bottleneck or none, keys and values from one kv_lora_rank latent
        # and a rope part shared by the heads; head_dim is qk_nope + qk_rope)
        self.shared = _n(rec, "shared_experts", 0)
        # DeepSeek-V3's router keeps a bias of E a layer (e_score_correction_bias, noaux_tc)
        self.router_bias = bool(rec.get("router_bias", False))
        self.dense_layers = _n(rec, "dense_layers", 0)
        mla = rec.get("mla")
        mla = mla if isinstance(mla, Mapping) else {}
        self.q_lora = _n(mla, "q_lora_rank", 0)
        self.kv_lora = _n(mla, "kv_lora_rank", 0)
        self.rope = _n(mla, "qk_rope_head_dim", 0)
        self.v_dim = _n(mla, "v_head_dim", 0)

    @property
    def moe(self) -> bool:
        return self.E > 0

    @property
    def mla(self) -> bool:
        return self.kv_lora > 0

    @property
    def moe_layers(self) -> int:
        return self.L - self.dense_layers if self.moe else 0

    @property
    def I_act(self) -> int:
        """The MLP width a token runs through: I, or its experts' (topk × Ie, and the shared
        experts')."""
        return (self.topk + self.shared) * self.Ie if self.moe else self.I

    def mlp_params(self) -> int:
        """A layer's gated MLP (gate, up, down), or its experts (routed and shared) and their
        router (H -> E)."""
        if not self.moe:
            return 3 * self.H * self.I
        return (
            (self.E + self.shared) * 3 * self.H * self.Ie
            + self.H * self.E
            + (self.E if self.router_bias else 0)
        )

    def attention_params(self) -> int:
        """q, k, v, o (with their bias and the q/k norms), or MLA's projections and norms."""
        if self.mla:
            q_out = self.a * self.d
            q = self.H * self.q_lora + self.q_lora + self.q_lora * q_out if self.q_lora else self.H * q_out
            kv = self.H * (self.kv_lora + self.rope) + self.kv_lora
            kv += self.kv_lora * self.a * (self.d - self.rope + self.v_dim)
            return q + kv + self.a * self.v_dim * self.H
        qkv = (self.a + 2 * self.k) * self.d
        return (
            self.H * qkv
            + (qkv if self.bias else 0)
            + self.a * self.d * self.H
            + (2 * self.d if self.qk_norm else 0)
        )

    def layer_params(self) -> int:
        """A decoder layer of the model's MLP kind (a mixture's sparse layer)."""
        return self.attention_params() + self.mlp_params() + 2 * self.H

    def decoder_params(self) -> int:
        """Every decoder layer: the sparse ones and the leading dense ones."""
        dense = self.attention_params() + 3 * self.H * self.I + 2 * self.H
        return (
            self.moe_layers * self.layer_params() + (self.L - self.moe_layers) * dense
            if self.moe
            else (self.L * self.layer_params())
        )

    def expert_params(self) -> int:
        """The routed experts of every sparse layer: what expert parallelism splits."""
        return self.moe_layers * self.E * 3 * self.H * self.Ie

    def root_params(self) -> int:
        """Outside the decoder layers: embeddings, the final norm, an untied lm_head."""
        return self.V * self.H * (1 if self.tied else 2) + self.H

    def params(self) -> int:
        return self.decoder_params() + self.root_params()

    def critic_params(self) -> int:
        """verl's critic is AutoModelForTokenClassification: no lm_head, a (H -> 1) score head."""
        return self.params() - (0 if self.tied else self.V * self.H) + self.H + 1

    def lora_params(self, rank: int) -> int:
        """peft's all-linear targets q, k, v, o, gate, up, down (every expert's): rank × (in +
        out) each."""
        H, q, kv = self.H, self.a * self.d, self.k * self.d
        mlp = 3 * self.E * (H + self.Ie) if self.moe else 3 * (H + self.I)
        return self.L * rank * ((H + q) + 2 * (H + kv) + (q + H) + mlp)

    def kv_bytes_per_token(self, nbytes: int) -> int:
        return self.L * 2 * self.k * self.d * nbytes
