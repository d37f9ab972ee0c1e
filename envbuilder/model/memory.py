"""How much GPU memory a verl PPO run needs per GPU, and the largest batch sizes that fit.

Pure arithmetic, no torch: the profile's dtype, attention, rollout and `train` block, the model's
architecture (matrices/models.yaml) and a few constants (matrices/memory.yaml). The resolver calls
`plan()` and keeps what it returns as `ResolvedEnv.memory`; the run script only formats it;
`envbuild show --memory` prints it. bench/memory_gpu.py checks it on a real GPU.

verl runs actor, rollout, reference and critic in one process per GPU, one phase at a time, so
the peak is the largest phase, and each phase is the state resident then plus its working set:

  generate       rollout and validation generation. HF rollout: `model.generate` on the actor's
                 own FSDP module; vLLM: the engine's `gpu_memory_utilization` share of the card
  log_prob       old-policy and reference log-probs: a forward without grad, entropy included
  actor_update   forward + backward at the actor's micro-batch (gradients accumulating)
  actor_step     Adam's step: no activations, but a parameter-sized temporary
  critic_update, critic_step   the same for the critic (a value head, no vocabulary logits)

State, per GPU (n = n_gpus; FSDP shards every role's state over the n GPUs):
  fp32 master weights  4 B × params / n. The actor and critic keep fp32 weights whatever the
                       compute dtype (the run script's comment says why); LoRA freezes the base
                       but verl still loads it in fp32.
  compute copy         FSDP mixed precision runs forward and backward on a bf16 copy: the whole
                       model on one GPU (NO_SHARD keeps it), the gathered units (the root unit -
                       embeddings, lm_head - and two decoder layers, with their gradients) on n > 1
  gradients            4 B × trainable / n (fp32; only the LoRA adapters when lora_rank > 0)
  Adam                 8 B × trainable / n (exp_avg and exp_avg_sq, fp32)
  Adam step temporary  4 B × trainable / n (torch's foreach Adam takes the sqrt of exp_avg_sq
                       into a new list of tensors)
  reference            2 or 4 B × params / n, unless param_offload (FSDP CPUOffload streams it
                       per layer) or LoRA (the actor without its adapters is the reference)
Outside its own phases a role's weights stay on the GPU unless param_offload, its Adam state
unless optimizer_offload; verl loads both back for the role's own phase, so offload never
shrinks a role's own update. The actor's weights follow actor_param_offload: off where the HF
rollout of the release cannot generate from an offloaded actor (the resolver's choice).

Working sets, at batch b, sequence s = prompt + response (padded: the worst case; remove-padding
saves only the padding), compute bytes c (2 for bf16, else 4):
  checkpoints      L × b·s × H × c             (gradient checkpointing keeps each layer's input)
  layer            2 × b·s × (4H + (a+2k)·d + a·d + 4I) × c
                   one decoder layer recomputed in backward: its activations and their grads
  eager scores     b × a × s² × (4 + c) × 2    (eager attention materialises the scores: the fp32
                   softmax and the compute-dtype copy, and their grads; this is what a Pascal
                   card without flash or memory-efficient attention pays)
  logits           b·s × V × c × copies        (the vocabulary logits and the log-prob/entropy
                   arithmetic over them; copies below)
  KV cache         b × s × L × 2 × k·d × g     (g: generation bytes; HF's DynamicCache grows by
                   torch.cat, so the last step also holds one layer's K copy)
  prefill          b × p × 3I × g              (the MLP's gate/up/product over the whole prompt,
                   HF prefills the whole batch at once) + eager prefill scores b·a·p²·(4+g)·2
Every constant of these formulas is a count of tensors in the code that runs (transformers'
Qwen2 and generate, verl's dp_actor / dp_critic / torch_functional); the H200 device run
(tests/fixtures/gpu/memory) checks the totals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import math

from envbuilder.model import memory_plan as P
from envbuilder.model.arch import Arch  # noqa: F401  (re-exported: the plan's view of a model)
from envbuilder.model.megatron import Layout, cp_ways, layouts, shard_params

GIB = 1024**3

# How many tensors of a shape are alive at a phase's peak. Counted in the code that runs
# (transformers' Qwen2 and generate, verl's dp_actor / torch_functional), then set from the H200
# device run (tests/fixtures/gpu/memory/h200-run.json; tests/test_memory_gpu.py replays it):
# training: the (b, s, V) logits, the gradient of the response slice and of the whole tensor, and
# verl's logprobs_from_logits_v2 row by row (fp32: gather + logsumexp; bf16: log_softmax); measured
# 2.8 for 0.5B models (fp32 and bf16), 2.0 for the 7B: the larger is kept.
LOGIT_COPIES_TRAIN = 2.8
# without grad (log_prob, calculate_entropy=True): the logits once, and entropy_from_logits'
# softmax and product over the response (b, r, V); under bf16 autocast those run in fp32 and
# logsumexp takes an fp32 copy: 6 bf16-sized tensors (measured 5.2 to 5.8), fp32: 2 (measured 2.0)
ENTROPY_COPIES = {4: 2.0, 2: 6.0}
# the recomputed layer in backward: its activations and their gradients (measured 1.5 to 1.8)
LAYER_FACTOR = 1.7
# eager attention in backward, over b·a·s²·(4 + c): scores, probabilities and their gradients
EAGER_TRAIN_COPIES = 1.0
# HF's prefill at the MLP, over the 3 (b, p, I) tensors it counts (4 with LoRA: the adapter's
# output beside the base's): the hidden states, the cache and the allocator's 2 MiB rounding add
# the rest (measured 1.11 to 1.41 on 0.5B models, at least 1.30 on the 7B)
PREFILL_FACTOR = 1.45
ROLLOUT_N = 1  # actor_rollout_ref.rollout.n where the plan is not told (GAE: one response)
# verl's fused log-prob/entropy kernels (use_fused_kernels; verl 0.9.1
# verl/utils/kernel/kernels.py): no (tokens, vocabulary) logits. Per token the forward keeps
# fp32 running maxima, sums and entropy terms for each 1024-column split of the vocabulary
# (3 × ceil(V/1024) × 4 B) and its log-prob and entropy; the backward splits d_logits along the
# vocabulary, FUSED_DLOGITS_COLUMNS columns at a time in the compute dtype, and returns the
# hidden states' gradient in fp32; the lm_head's gradient is one vocabulary × hidden fp32 tensor.
FUSED_DLOGITS_COLUMNS = 9504
# the torch backend (verl/utils/experimental/torch_functional.py FusedLinearForPPO, chunk_size
# 512): one chunk's fp32 logits, their log-softmax and the entropy's softmax × logits product
FUSED_CHUNK_TOKENS = 512
FUSED_CHUNK_COPIES = 4
# vLLM's sampler at the last decode step: the next-token logits in fp32 and the copies its
# sampling makes of them (temperature-scaled logits, probabilities, log-probs for the
# log-probs verl asks back, the sampled result's gather), [running requests × vocabulary] each
VLLM_SAMPLER_COPIES = 5


def _gib(nbytes: float) -> float:
    return nbytes / GIB


def _m(count: int) -> str:
    return f"{count / 1e6:.1f}M" if count < 1e9 else f"{count / 1e9:.2f}B"


Data = Mapping[str, object]  # (plain data: a resolved environment's, memory.yaml's)


def _get(d: Data, key: str, default: object = None) -> object:
    value = d.get(key, default)
    return default if value is None else value


def _int(d: Data, key: str, default: int | None = None) -> int:
    value = _get(d, key, default)
    if not isinstance(value, int):
        raise TypeError(f"{key}: {value!r} is not a whole number")
    return value


def _num(d: Data, key: str, default: float | None = None) -> float:
    value = _get(d, key, default)
    if not isinstance(value, (int, float)):
        raise TypeError(f"{key}: {value!r} is not a number")
    return value


def _str(d: Data, key: str, default: str | None = None) -> str:
    value = _get(d, key, default)
    if not isinstance(value, str):
        raise TypeError(f"{key}: {value!r} is not a string")
    return value


def _map(d: Data, key: str) -> Data:
    value = d.get(key)
    return value if isinstance(value, Mapping) else {}


class Setup:
    """What of a resolved environment the estimate reads."""

    def __init__(self, env: Data, arch: Arch, consts: Data, val_rows: int):
        t = _map(env, "train")
        self.arch, self.val_rows = arch, val_rows
        # memory.yaml's constants (with the card's total_gib)
        self.margin = _num(consts, "margin")
        self.alloc_overhead = _num(consts, "allocator_overhead")
        self.hf_overhead = _num(consts, "hf_generate_overhead")
        self.cuda_context_gib = _num(consts, "cuda_context_gib")
        self.nccl_gib = _num(consts, "nccl_gib")
        self.validation_share = _num(consts, "validation_share")
        self.dtype, self.rollout = _str(env, "dtype"), _str(env, "rollout")
        self.eager = env["attention"] == "eager"
        self.per_node = _int(t, "n_gpus")
        self.n = self.per_node * _int(env, "nodes", 1)  # the world: every GPU of every node
        self.prompt, self.response = _int(t, "max_prompt_length"), _int(t, "max_response_length")
        self.seq = self.prompt + self.response
        self.lora = _int(t, "lora_rank")
        self.param_offload, self.optimizer_offload = bool(t["param_offload"]), bool(t["optimizer_offload"])
        # the actor's own parameter offload: off where the release's HF rollout cannot generate
        # from an offloaded actor (the resolver decides; verl.yaml hf_rollout.offload)
        self.actor_param_offload = bool(t.get("actor_param_offload", self.param_offload))
        # LoRA on the HF rollout: one FSDP unit holds base and adapters (use_orig_params=True),
        # and FSDP keeps a gradient for the whole flat parameter, frozen base included
        self.lora_flat = bool(self.lora) and bool(env.get("lora_flat_grads", False))
        # the actor's frozen base in bf16 (fsdp_config.model_dtype; LoRA on one GPU, see
        # sizing.lora_memory): 2 B a parameter and no separate compute copy of it
        self.base_bytes = 2 if (self.lora and t.get("actor_model_dtype") == "bf16") else 4
        self.ckpt = bool(t["gradient_checkpointing"])
        # vLLM's share of the card: at most the profile's figure; plan() sets what it needs
        self.util = self.max_util = _num(t, "gpu_memory_utilization")
        # the rollout's tensor parallelism (GPUs per vLLM engine, within a node) and Ulysses
        # sequence parallelism (GPUs one sequence is split over); plan() chooses both
        self.tp = _int(t, "rollout_tp", 1) or 1
        self.sp = _int(t, "sequence_parallel", 1) or 1
        # vLLM's sampler at its last decode step (HF generate holds one logits row a sequence)
        self.sampler_copies = VLLM_SAMPLER_COPIES if self.rollout == "vllm" else 0
        # verl's fused log-prob/entropy kernels (a backend, or None: the logits materialised)
        # (the resolver passes it; a resolved environment holds it in its features)
        fused = env.get("fused_kernels", _map(env, "features").get("fused_kernels"))
        self.fused = fused if isinstance(fused, str) and fused else None
        # an optional upper bound from the profile, on every micro-batch
        self.profile_cap: int | None = _int(t, "micro_batch_size_per_gpu", 0) or None
        # token budgets (the actor's update and the log-prob passes, where verl's fused kernels
        # run): a micro-batch takes at most max_micro_tokens (and one whole sequence). The
        # critic keeps count-based micro-batches (runplan: its engine's use_dynamic_bsz=False),
        # so this bound is not its own: capped by it, the h100 GAE critic ran 32 sequences a
        # micro-batch where 128 fit, at 0.17 MFU against 0.27 (tests/fixtures/gpu/speed)
        max_tokens = _int(consts, "max_micro_tokens", 0)
        self.token_cap: int | None = (
            max(1, max_tokens * self.sp // self.seq) if self.fused and max_tokens else None
        )
        # compute bytes of the actor/critic (fp32 where the GPU has no bf16: see the run script)
        self.c = 2 if self.dtype == "bf16" else 4
        # inference bytes (vLLM and the reference run in fp16 where bf16 is missing)
        self.inf = 4 if self.dtype == "fp32" else 2
        # the HF rollout generates with the actor's FSDP module, in its compute dtype
        self.g = self.c if self.rollout == "hf" else self.inf
        # the estimator (algorithms.yaml): a critic (gae only), and rollout.n responses per
        # prompt, so the rollout and each mini-batch hold n times the prompts
        self.critic = bool(env.get("critic", True))
        self.rollout_n = _int(env, "rollout_n", ROLLOUT_N)
        self.gen_per_gpu = _int(t, "train_batch_size") * self.rollout_n // self.n
        # an SP group of sp GPUs trains one data-parallel rank's sequences, each split over the
        # group: verl divides the batches by the data-parallel size, world / sp
        self.dp = max(self.n // self.sp, 1)
        # verl's Megatron engine (--engine megatron): its layout (megatron.py) sets the
        # data-parallel size the batches are divided by, world / (TP × PP × CP)
        self.engine = _str(env, "engine", "fsdp") or "fsdp"
        lay = _map(t, "megatron")
        self.layout = _layout(lay) if lay else Layout()
        if self.engine == "megatron":
            self.dp = self.layout.dp(self.n)
        self.data_per_rank = _int(t, "train_batch_size") * self.rollout_n // self.dp
        self.mini_per_gpu = max(_int(t, "ppo_mini_batch_size") * self.rollout_n // self.dp, 1)
        self.val_per_gpu = math.ceil(val_rows / self.n)
        # verl's engine workers (0.8+) assert that each GPU's share of the rollout is a whole
        # number of log-prob micro-batches; the legacy workers split it with a remainder
        # (the resolver passes it; a resolved environment holds it in its verl record)
        self.engine_batches = bool(env.get("engine_batches", _map(env, "verl").get("engine_batches", False)))
        # the host memory of a node that offload may fill (--host-memory, else memory.yaml's
        # figure a GPU)
        self.host_gib = (
            _num(t, "host_memory_gib", 0) or _num(consts, "host_memory_gib_per_gpu") * self.per_node
        )
        self.total_gib = _num(consts, "total_gib")
        self.usable_gib = self.total_gib - self.cuda_context_gib - (self.nccl_gib if self.n > 1 else 0)

    def cap(self, key: str) -> int | None:
        """The most sequences one micro-batch of phase `key` may take (None: no bound). The
        rollout's concurrency has none; the critic only the profile's."""
        if key == "generation":
            return None
        caps = [c for c in (self.profile_cap, None if key == "critic" else self.token_cap) if c]
        return min(caps) if caps else None


def _layout(d: Data) -> Layout:
    """A Megatron layout of plain data ({tp, pp, ep, cp, etp}: the keys given)."""
    return Layout(**{k: _int(d, k) for k in d})


class Term:
    """One line of a budget. kind: `state` (the working role's weights, gradients, optimizer),
    `resident` (what the other roles leave on the GPU meanwhile), `work` (the batch's working set)."""

    __slots__ = ("name", "formula", "nbytes", "kind")

    def __init__(self, name: str, formula: str, nbytes: float, kind: str = "state"):
        self.name, self.formula, self.nbytes, self.kind = name, formula, nbytes, kind

    def record(self, kind: str | None = None) -> P.Term:
        """The term as the plan keeps it (`kind`: another kind, as `host` gives its terms)."""
        return P.Term(
            term=self.name,
            formula=self.formula,
            gib=round(_gib(self.nbytes), 3),
            kind=kind or self.kind,
            bytes=int(self.nbytes),
        )


# -- state -------------------------------------------------------------------------------------


def _megatron_state(s: Setup, role: str) -> dict[str, Term]:
    """A role's state on one GPU of the Megatron engine (megatron.py): bf16 weights and fp32
    main gradients of its shard, the distributed optimizer's fp32 main weights and Adam moments
    over the data-parallel ranks."""
    a, lay = s.arch, s.layout
    params = a.params() if role == "actor" else a.critic_params()
    dense, experts = shard_params(a, lay, params)
    shard = dense + experts
    opt = dense / (lay.dp(s.n) * lay.cp) + experts / lay.edp(s.n)
    where = f"{_m(int(shard))} params a GPU ({lay.words()})"
    ranks = f"{lay.dp(s.n) * lay.cp}" + (f" (experts {lay.edp(s.n)})" if a.moe else "")
    return {
        "weights": Term(f"{role} weights", f"2 B × {where} (bf16)", 2 * shard),
        "grads": Term(f"{role} gradients", f"4 B × {where} (fp32 main gradients)", 4 * shard),
        "adam": Term(
            f"{role} optimizer state",
            f"12 B × {_m(int(opt))} params (fp32 main weights + Adam, distributed over {ranks} data-parallel ranks)",
            12 * opt,
        ),
        # (no step temporary: Megatron's Adam (TransformerEngine's FusedAdam) updates in place)
    }


def _role_state(s: Setup, role: str) -> dict[str, Term]:
    """A role's own state (weights, compute copy, grads, Adam, step temporary) on one GPU."""
    if s.engine == "megatron":
        return _megatron_state(s, role)
    a, n = s.arch, s.n
    params = a.params() if role == "actor" else a.critic_params()
    lora = a.lora_params(s.lora) if (role == "actor" and s.lora) else 0
    trainable = lora or params
    graded = params + lora if (lora and s.lora_flat) else trainable
    per = f" / {n} GPUs" if n > 1 else ""
    if lora and s.base_bytes == 2:  # the frozen base loaded in bf16, the adapters fp32
        out = {
            "weights": Term(
                f"{role} weights",
                f"2 B × {_m(params)} params (bf16 base) + 4 B × {_m(lora)} LoRA params (fp32)",
                2 * params + 4 * lora,
            )
        }
    else:
        out = {
            "weights": Term(
                f"{role} weights",
                f"4 B × {_m(params + lora)} params{per} (fp32 master)",
                4 * (params + lora) / n,
            )
        }
    if n == 1:
        if s.c < 4 and lora and s.base_bytes == 2:
            out["copy"] = Term(
                f"{role} bf16 copy",
                f"2 B × {_m(lora)} LoRA params (FSDP mixed precision: the base is bf16 already)",
                2 * lora,
            )
        elif s.c < 4:
            out["copy"] = Term(
                f"{role} bf16 copy",
                f"2 B × {_m(params + lora)} params (FSDP mixed precision, NO_SHARD)",
                2 * (params + lora),
            )
    else:
        units = a.root_params() + 2 * a.layer_params()
        out["copy"] = Term(
            f"{role} FSDP gathered units",
            f"2 × {s.c} B × {_m(units)} params (root unit + 2 layers, weights and their grads)",
            2 * s.c * units,
        )
    kind = "LoRA " if lora else ""
    if graded != trainable:
        out["grads"] = Term(
            f"{role} gradients",
            f"4 B × {_m(graded)} params{per} (LoRA in one "
            "FSDP flat parameter: its gradient spans the frozen base)",
            4 * graded / n,
        )
    else:
        out["grads"] = Term(
            f"{role} gradients", f"4 B × {_m(trainable)} {kind}params{per}", 4 * trainable / n
        )
    out["adam"] = Term(f"{role} Adam state", f"8 B × {_m(trainable)} {kind}params{per}", 8 * trainable / n)
    out["step"] = Term(
        f"{role} Adam step temporary",
        f"4 B × {_m(trainable)} {kind}params{per} (foreach sqrt)",
        4 * trainable / n,
    )
    return out


def _reference(s: Setup) -> Term | None:
    if s.lora or s.param_offload:
        return None
    if s.engine == "megatron":
        dense, experts = shard_params(s.arch, s.layout, s.arch.params())
        return Term(
            "reference weights (resident)",
            f"2 B × {_m(int(dense + experts))} params a GPU ({s.layout.words()}, bf16)",
            2 * (dense + experts),
            "resident",
        )
    return Term(
        "reference weights (resident)",
        f"{s.inf} B × {_m(s.arch.params())} params" + (f" / {s.n} GPUs" if s.n > 1 else ""),
        s.inf * s.arch.params() / s.n,
        "resident",
    )


def _resident(s: Setup, busy: str) -> list[Term]:
    """What other roles leave on the GPU while `busy` works."""
    out = []
    for role in ("actor", "critic") if s.critic else ("actor",):
        if role == busy:
            continue
        st = _role_state(s, role)
        if not (s.actor_param_offload if role == "actor" else s.param_offload):
            out.append(
                Term(
                    f"{st['weights'].name} (resident)",
                    st["weights"].formula,
                    st["weights"].nbytes,
                    "resident",
                )
            )
        if not s.optimizer_offload:
            out.append(
                Term(f"{st['adam'].name} (resident)", st["adam"].formula, st["adam"].nbytes, "resident")
            )
    ref = _reference(s)
    if ref:
        out.append(ref)
    return out


# -- working sets ------------------------------------------------------------------------------


def _work(terms: list[Term]) -> list[Term]:
    for term in terms:
        term.kind = "work"
    return terms


def _layer_width(a: Arch) -> int:
    """Activation values one decoder layer keeps per token: norm inputs and outputs (4H), q/k/v
    ((a+2k)d), K and V repeated to every head for grouped-query attention (2ad), the attention
    output (ad), the MLP's gate, activation, up and product (4I; a mixture of experts: those of
    the topk experts a token runs, its hidden state copied to each (topk × H) and the router's
    fp32 logits (2E))."""
    moe = a.topk * a.H + 2 * a.E if a.moe else 0
    if a.mla:  # q, the latent, K and V expanded to every head, the attention output
        attn = a.a * a.d + (a.kv_lora + a.rope) + a.a * a.d + 2 * a.a * a.v_dim
        return 4 * a.H + attn + 4 * a.I_act + moe
    return 4 * a.H + (a.a + 2 * a.k) * a.d + 2 * a.a * a.d + a.a * a.d + 4 * a.I_act + moe


def _tokens(s: Setup, b: int) -> tuple[int, str]:
    """The tokens one GPU holds at micro-batch b, and how they are written: Ulysses splits each
    sequence over its sp GPUs (attention gathers the whole sequence for a/sp heads)."""
    if s.sp == 1:
        return b * s.seq, f"{b}×{s.seq}"
    return -(-b * s.seq // s.sp), f"{b}×{s.seq}/{s.sp} (Ulysses SP)"


def _train_work(s: Setup, b: int, logits: bool) -> list[Term]:
    a, c = s.arch, s.c
    T, tok = _tokens(s, b)
    heads = a.a // s.sp
    width = _layer_width(a)
    out = []
    if s.ckpt:
        out.append(Term("checkpoints", f"{a.L} layers × {tok} tokens × {a.H} × {c} B", a.L * T * a.H * c))
        out.append(
            Term(
                "recomputed layer",
                f"{LAYER_FACTOR:g} × {tok} tokens × {width} values × {c} B",
                LAYER_FACTOR * T * width * c,
            )
        )
    else:
        out.append(
            Term(
                "activations",
                f"{a.L} layers × {tok} tokens × {width} values × {c} B (no checkpointing)",
                a.L * T * width * c,
            )
        )
    if s.eager:
        n_layers = 1 if s.ckpt else a.L
        out.append(
            Term(
                "eager attention scores",
                f"{n_layers} × {b} × {heads} heads × {s.seq}² × (4+{c}) B × {EAGER_TRAIN_COPIES:g}",
                n_layers * b * heads * s.seq**2 * (4 + c) * EAGER_TRAIN_COPIES,
            )
        )
    if logits and s.fused:
        out.append(_fused_term(s, T, backward=True))
    elif logits:
        k = LOGIT_COPIES_TRAIN
        out.append(Term("logits", f"{tok} tokens × {a.V} vocab × {c} B × {k:g} copies", T * a.V * c * k))
    return _work(out)


def _fused_term(s: Setup, T: int, backward: bool) -> Term:
    """verl's fused log-prob/entropy kernels at T tokens. torch (FusedLinearForPPO): one chunk
    of FUSED_CHUNK_TOKENS tokens' fp32 logits and the copies its log-softmax and entropy make,
    at a time; triton (linear_cross_entropy): fp32 partials for each 1024-column split of the
    vocabulary, and in backward a FUSED_DLOGITS_COLUMNS-wide slice of d_logits. Both return
    each token's log-prob and entropy in fp32 and, in backward, the hidden states' gradient in
    fp32 and lm_head's as one vocabulary × hidden fp32 tensor."""
    a, c = s.arch, s.c
    if s.fused == "torch":
        chunk = min(FUSED_CHUNK_TOKENS, T)
        k = FUSED_CHUNK_COPIES
        per_token, fixed = 8, chunk * a.V * 4 * k
        what = f"{T} tokens × 8 B + a {chunk}-token chunk × {a.V} vocab × 4 B × {k} copies"
    else:
        splits = -(-a.V // 1024)
        per_token, fixed = 3 * splits * 4 + 8, 0
        what = f"{T} tokens × (3 × {splits} splits × 4 B + 8 B)"
        if backward:
            cols = min(FUSED_DLOGITS_COLUMNS, a.V)
            per_token += cols * c
            what += f" + {cols} d_logits columns × {c} B a token"
    if not backward:
        return Term(f"fused log-probs ({s.fused})", what, T * per_token + fixed)
    return Term(
        f"fused log-probs ({s.fused}), backward",
        f"{what} + {T} tokens × {a.H} × 4 B + lm_head gradient {a.V} × {a.H} × 4 B",
        T * (per_token + a.H * 4) + fixed + a.V * a.H * 4,
    )


def _nograd_work(s: Setup, b: int) -> list[Term]:
    a, c = s.arch, s.c
    T, tok = _tokens(s, b)
    out = [Term("forward transient", f"{tok} tokens × (2H + 3I) × {c} B", T * (2 * a.H + 3 * a.I_act) * c)]
    if s.eager:
        out.append(
            Term(
                "eager attention scores",
                f"{b} × {a.a // s.sp} heads × {s.seq}² × (4+{c}) B",
                b * (a.a // s.sp) * s.seq**2 * (4 + c),
            )
        )
    if s.fused:
        out.append(_fused_term(s, T, backward=False))
        return _work(out)
    k = ENTROPY_COPIES[c]
    out.append(
        Term(
            "logits + entropy",
            f"{b} × ({s.seq} + {k:g}×{s.response}) tokens{f' / {s.sp} (Ulysses SP)' if s.sp > 1 else ''} × {a.V} vocab × {c} B",
            b * (s.seq + k * s.response) * a.V * c / s.sp,
        )
    )
    return _work(out)


def generate_work(s: Setup, b: int) -> tuple[str, list[Term]]:
    """HF generate's peak at batch b: the prefill (the whole prompt at once) or the last decode
    step (the full cache); whichever is larger."""
    a, g, p = s.arch, s.g, s.prompt
    # a TP engine of tp GPUs runs tp × b sequences; each GPU keeps k / tp of the KV heads (a
    # copy of one where tp exceeds them: vLLM replicates KV heads) and samples over all of them
    tp = s.tp if s.rollout == "vllm" else 1
    kv_heads = max(a.k // tp, 1) * tp
    kvt = a.L * 2 * kv_heads * a.d * g
    kv_what = (
        f"{a.k}×{a.d}" if kv_heads == a.k else f"{tp} × 1×{a.d} (a KV head replicated on each of {tp} GPUs)"
    )
    kv_mult = "2 × "  # (K and V)
    if a.mla:  # MLA caches one latent of kv_lora + rope a token and layer, whole on each TP rank
        kvt, kv_mult = tp * a.L * (a.kv_lora + a.rope) * g, ""
        kv_what = f"({a.kv_lora}+{a.rope}) MLA latent" + (f" (whole on each of {tp} GPUs)" if tp > 1 else "")
    if s.sampler_copies:
        k = s.sampler_copies
        running = f"{b} running" if tp == 1 else f"{tp}×{b} running (the engine's)"
        last_logits = Term(
            "sampler", f"{running} × {a.V} vocab × 4 B × {k} copies (vLLM's sampler)", tp * b * a.V * 4 * k
        )
    else:
        last_logits = Term("next-token logits", f"{b} × {a.V} vocab × (4+4+{g}) B", b * a.V * (8 + g))
    n_mlp = 3 + (1 if (s.lora and s.rollout == "hf") else 0)
    mlp = PREFILL_FACTOR * b * p * n_mlp * a.I_act * g
    scores = b * a.a * p**2 * (4 + g) if s.eager else 0
    prefill = [
        Term(
            "KV cache (prompt)", f"{b} × {p} tokens × {a.L} layers × {kv_mult}{kv_what} × {g} B", b * p * kvt
        ),
        Term(
            "prefill transient",
            f"max(MLP {PREFILL_FACTOR:g} × {b}×{p} tokens × "
            f"{n_mlp}×{a.I_act} × {g} B"
            + (f", eager scores {b} × {a.a} heads × {p}² × (4+{g}) B)" if s.eager else ")"),
            max(mlp, scores),
        ),
        last_logits,
    ]
    decode = [
        Term(
            "KV cache", f"{b} × {s.seq} tokens × {a.L} layers × {kv_mult}{kv_what} × {g} B", b * s.seq * kvt
        ),
        Term(
            "cache growth copy",
            f"{b} × {s.seq} tokens × {a.k}×{a.d} × {g} B (torch.cat re-allocates one layer's K)",
            b * s.seq * a.k * a.d * g,
        ),
    ]
    if a.a > a.k:
        decode.append(
            Term(
                "K/V repeated to every head",
                f"2 × {b} × {s.seq} tokens × {a.a}×{a.d} × {g} B (repeat_kv, one layer)",
                2 * b * s.seq * a.a * a.d * g,
            )
        )
    decode.append(last_logits)
    if sum(t.nbytes for t in prefill) > sum(t.nbytes for t in decode):
        return "prefill", _work(prefill)
    return "last decode step", _work(decode)


# -- phases ------------------------------------------------------------------------------------


def _gen_weights(s: Setup) -> list[Term]:
    if s.rollout == "hf":  # the actor's own module, loaded on the GPU to generate
        st = _role_state(s, "actor")
        return [st["weights"]] + ([st["copy"]] if "copy" in st else [])
    if s.tp == 1:
        out = [Term("vLLM weights", f"{s.inf} B × {_m(s.arch.params())} params", s.inf * s.arch.params())]
    else:
        out = [
            Term(
                "vLLM weight shard",
                f"{s.inf} B × {_m(s.arch.params())} params / {s.tp} (tensor parallel)",
                s.inf * s.arch.params() / s.tp,
            )
        ]
    if s.lora:
        # verl serves the adapters as a LoRA of vLLM's (enable_lora, max_loras=1): vLLM keeps one
        # slot of every target module's A and B at the rank, in its dtype, beside the base
        lora = s.arch.lora_params(s.lora)
        out.append(
            Term(
                "vLLM LoRA slot",
                f"{s.inf} B × {_m(lora)} LoRA params" + (f" / {s.tp}" if s.tp > 1 else ""),
                s.inf * lora / s.tp,
            )
        )
    return out


# a phase worked out, not yet a record: its name, batch, terms and the bytes of them already
# whole (vLLM's share); the batch search sums its terms, the plan keeps the chosen one's records
Draft = tuple[str, int | None, list[Term], int | None]


def phase(s: Setup, name: str, b: int) -> Draft:
    """One phase at batch b: its name and terms."""
    note = ""
    if name == "generate":
        note, work = generate_work(s, b)
        terms = _gen_weights(s) + work
        if s.rollout == "hf":
            terms += _resident(s, "actor") + _actor_resident_optimizer(s)
    elif name in ("actor_update", "critic_update", "actor_step", "critic_step"):
        role = name.split("_")[0]
        st = _role_state(s, role)
        if name.endswith("update"):
            terms = [st[k] for k in ("weights", "copy", "grads", "adam") if k in st]
            terms += _train_work(s, b, logits=role == "actor")
        else:
            terms = [st[k] for k in ("weights", "copy", "grads", "adam", "step") if k in st]
        terms += _resident(s, role)
    elif name == "log_prob":
        st = _role_state(s, "actor")
        terms = [st[k] for k in ("weights", "copy") if k in st] + _nograd_work(s, b)
        terms += _resident(s, "actor") + _actor_resident_optimizer(s)
    else:
        raise ValueError(name)
    split = s.layout.tp * s.layout.cp if s.engine == "megatron" and name != "generate" else 1
    if split > 1:  # sequence parallelism and the vocabulary-parallel logits (megatron.py)
        for t in terms:
            if t.kind == "work":
                t.nbytes /= split
                t.formula += f" / {split} (TP {s.layout.tp} sequence parallel" + (
                    f", CP {s.layout.cp} context parallel)" if s.layout.cp > 1 else ")"
                )
    return name + (f" ({note})" if note else ""), b, terms, None


def _actor_resident_optimizer(s: Setup) -> list[Term]:
    """The actor's Adam state while the actor generates or scores (unless optimizer_offload)."""
    if s.optimizer_offload:
        return []
    st = _role_state(s, "actor")
    return [Term(f"{st['adam'].name} (resident)", st["adam"].formula, st["adam"].nbytes, "resident")]


def vllm_phase(s: Setup, b: int) -> Draft:
    """Inside vLLM's share (gpu_memory_utilization × the card): its weights and, sized the HF way
    (whole-batch prefill: more than vLLM's chunked prefill needs), max_num_seqs sequences."""
    note, work = generate_work(s, b)
    return f"vLLM engine ({note})", b, _gen_weights(s) + work, None


def vllm_outside(s: Setup) -> Draft:
    """While vLLM generates, the rest of the process: the engine's share and the resident roles."""
    share = s.util * s.total_gib * GIB
    terms = [Term("vLLM share", f"gpu_memory_utilization {s.util:g} × {s.total_gib:.1f} GiB", share, "work")]
    terms += _resident(s, "rollout")  # (not a role: the actor's and critic's state both count)
    return "generate (vLLM)", None, terms, int(share)


# -- the plan ---------------------------------------------------------------------------------


def overhead(s: Setup, key: str) -> float:
    """The allocator's overhead for a phase (allocator_overhead)."""
    return allocator_overhead(s.rollout, key, s.hf_overhead, s.alloc_overhead)


def allocator_overhead(rollout: str, key: str, hf_generate: float, common: float) -> float:
    """The allocator's overhead for a phase: HF generate's own where it generates (its KV cache
    grows a token at a time and eager attention's score blocks come and go), else the common one."""
    if key == "generation" and rollout == "hf":
        return float(hf_generate)
    return float(common)


def fits(
    s: Setup, nbytes: float, budget_gib: float, margin: bool = True, exempt: float = 0, key: str = ""
) -> bool:
    """Whether `nbytes` of tensors fit `budget_gib` once the allocator's overhead for phase `key`
    is added (and, with `margin`, leaving the margin free). `exempt`: bytes of a budget already
    whole (vLLM's share), which takes no overhead."""
    if margin:
        budget_gib *= 1 - s.margin
    return (nbytes - exempt) * (1 + overhead(s, key)) + exempt <= budget_gib * GIB


def _largest(candidates: Sequence[int], ok: Callable[[int], bool]) -> int | None:
    """The largest candidate for which ok() holds; memory grows with the batch (bisection)."""
    lo, hi, best = 0, len(candidates) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if ok(candidates[mid]):
            best, lo = candidates[mid], mid + 1
        else:
            hi = mid - 1
    return best


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def candidates(s: Setup, key: str) -> Sequence[int]:
    """The batch sizes a phase may take.
    generation, HF rollout: verl's HFRollout splits a batch into batch // micro_batch_size chunks
      that DataProto.chunk requires to be equal, so below the rollout batch only its divisors
      work; above it any size up to the validation set (a validation batch of up to
      micro_batch_size is one chunk). vLLM: any count up to the larger of the two.
    log_prob: up to the rollout batch (the legacy workers split it into micro-batches, the last
      may be short); only its divisors where the release's engine workers assert that they
      divide it (verl 0.8+, workers/engine/utils.py prepare_micro_batches).
    actor, critic: divisors of the mini-batch (verl asserts mini % micro == 0)."""
    cap = s.cap(key)
    if key == "generation":
        top = max(s.gen_per_gpu, s.val_per_gpu)
        if s.rollout == "hf" and s.rollout_n > 1:
            # HFRollout chunks the prompts by micro_batch_size and generates n sequences of
            # each (num_return_sequences): a generate call holds n × a divisor of the prompts
            prompts = s.gen_per_gpu // s.rollout_n
            return [s.rollout_n * d for d in divisors(prompts)]
        if s.rollout == "hf":
            return divisors(s.gen_per_gpu) + list(range(s.gen_per_gpu + 1, top + 1))
        return range(1, top + 1)
    if key == "log_prob" and s.engine_batches:
        return [b for b in divisors(s.data_per_rank) if not cap or b <= cap] or [1]
    if key == "log_prob":  # (a range: a huge batch costs no memory here)
        return range(1, min(s.data_per_rank, cap or s.data_per_rank) + 1)
    out = divisors(s.mini_per_gpu)
    return [b for b in out if b <= cap] or [1] if cap else out


def estimate(s: Setup, key: str, batch: int) -> P.Phase:
    """One phase at `batch`: its terms, total and budget."""
    (name, b, terms, exempt), budget = _draft(s, key, batch)
    total = sum(t.nbytes for t in terms)
    return P.Phase(
        phase=name,
        batch=b,
        terms=tuple(t.record() for t in terms),
        total_gib=round(_gib(total), 3),
        bytes=int(total),
        budget_gib=round(budget, 3),
        exempt_bytes=exempt,
    )


def _need(s: Setup, key: str, batch: int) -> int:
    """The bytes of one phase's tensors at `batch` (estimate's `bytes`, no records made)."""
    return int(sum(t.nbytes for t in _draft(s, key, batch)[0][2]))


def _draft(s: Setup, key: str, batch: int) -> tuple[Draft, float]:
    """One phase at `batch`, and its budget (GiB)."""
    budget = s.usable_gib
    if key == "generation":
        if s.rollout == "hf":
            out = phase(s, "generate", batch)
        else:
            out, budget = vllm_phase(s, batch), s.util * s.total_gib
    elif key == "generate_outside":
        out = vllm_outside(s)
    else:
        out = phase(
            s,
            {
                "log_prob": "log_prob",
                "actor": "actor_update",
                "critic": "critic_update",
                "actor_step": "actor_step",
                "critic_step": "critic_step",
            }[key],
            batch,
        )
    return out, budget


BATCHED = ("generation", "log_prob", "actor", "critic")


def split_ways(n: int, arch: Arch, per_node: int) -> list[int]:
    """How many GPUs of one node a model's heads can be split over (vLLM's tensor parallelism,
    Ulysses' sequence parallelism): divisors of the node's GPUs that divide the attention heads,
    and the KV heads or a multiple of them (vLLM replicates KV heads past their count)."""
    return [
        w for w in divisors(per_node) if w <= n and arch.a % w == 0 and (arch.k % w == 0 or w % arch.k == 0)
    ]


def host(s: Setup) -> P.Host:
    """What offload keeps in the host's memory, per node: each GPU's offloaded share of the
    idle weights (fp32 actor and critic, the reference in its dtype) and of Adam's state."""
    terms = []
    for role in ("actor", "critic") if s.critic else ("actor",):
        st = _role_state(s, role)
        if s.actor_param_offload if role == "actor" else s.param_offload:
            terms.append(st["weights"])
        if s.optimizer_offload:
            terms.append(st["adam"])
    if s.param_offload and not s.lora:
        terms.append(
            Term(
                "reference weights",
                f"{s.inf} B × {_m(s.arch.params())} params / {s.n} GPUs",
                s.inf * s.arch.params() / s.n,
            )
        )
    per_gpu = sum(t.nbytes for t in terms)
    budget = s.host_gib
    return P.Host(
        terms=tuple(t.record(kind="host") for t in terms),
        gpus_per_node=s.per_node,
        gib=round(_gib(per_gpu * s.per_node), 3),
        budget_gib=round(budget, 3),
        fits=per_gpu * s.per_node <= budget * GIB * (1 - s.margin),
    )


def vllm_share(s: Setup) -> float:
    """vLLM's gpu_memory_utilization: the room the resident roles leave on the card while it
    generates (the margin kept free), at most the profile's figure, in hundredths of the card."""
    resident = sum(t.nbytes for t in _resident(s, "rollout"))
    room = s.usable_gib * (1 - s.margin) - _gib(resident) * (1 + overhead(s, "generate_outside"))
    share = min(s.max_util * s.total_gib, room)
    return max(math.floor(float(share / s.total_gib) * 100) / 100, 0.01)


def plan(env: Data, arch_rec: Data, consts: Data, val_rows: int) -> P.MemoryPlan:
    """The memory budget and the batch sizes of a resolved profile (`env`: at least dtype,
    attention, rollout and train of a resolved environment, as plain data; `consts`: matrices/memory.yaml's `memory`
    with the card's total_gib), with what makes it fit and run, chosen in order of cost:
      1. the rollout's tensor parallelism: the smallest that holds the weight shard, the KV cache
         for the planned concurrency and the sampler (a TP group within a node);
      2. FSDP sharding over the whole world (nodes × GPUs: every role's state divided by it);
      3. offload of what is idle: Adam's state, then the weights (host memory counted);
      4. Ulysses sequence parallelism where one sequence's activations do not fit (FSDP), or
         on the Megatron engine its layout (TP, PP, EP), then context parallelism (CP) where
         no layout at CP 1 fits one sequence's activations;
      5. vLLM's share of the card: what the resident roles leave, at most the profile's figure.
    `env["pinned"]` names the choices the user made (rollout_tp, offload, sequence_parallel):
    those are taken as given."""
    train = _map(env, "train")
    arch = Arch(_str(train, "model"), arch_rec)
    pinned = {str(p) for p in _list(env, "pinned")}
    tried: list[P.MemoryPlan] = []
    trials = _trials(env, arch, pinned)
    # The Megatron engine's context parallelism (CP) last: after every CP 1 layout (any TP,
    # PP, EP) at every offload. A GPU's weights, gradients and distributed optimizer state are
    # the same at any CP (the optimizer shards over DP × CP = world / (TP × PP) whatever CP
    # is), so CP helps only one sequence's activations, while it passes every attention
    # layer's keys and values around a ring and takes GPUs from data parallelism; offload and
    # PP are cheaper, as FSDP's Ulysses SP comes after offload (_trials). Within CP: the
    # smallest CP, then the cheapest offload, then the layout order (megatron.layouts).
    short: P.MemoryPlan | None = None
    for cp in [1, *_cp_ways(env)]:
        for t, why in trials:
            for lay in _layouts(env, arch, cp):
                out = _layout_plan(env, arch, consts, val_rows, pinned, t, why, lay)
                tried.append(out)
                if not out.problems:
                    return out
        short = short or tried[-1]._replace(tried=len(tried))
    # none fits: the last at CP 1 (everything tried but splitting sequences) says what is
    # still short: where a larger CP fits nothing, the sequences are not what is short
    assert short is not None  # (CP 1 tries at least one plan)
    return short


def _layout_plan(
    env: Data,
    arch: Arch,
    consts: Data,
    val_rows: int,
    pinned: set[str],
    t: dict[str, object],
    why: dict[str, P.Choice],
    lay: Layout | None,
) -> P.MemoryPlan:
    """The plan of one train block (`why`: its choices) at one Megatron layout (None: FSDP)."""
    trial = dict(t, megatron=lay.to_dict()) if lay else t
    out = _with_tp(dict(env, train=trial), arch, consts, val_rows, pinned)
    choices = out.choices._replace(**why)
    if lay:
        words = P.LayoutChoice(value=MappingProxyType(lay.to_dict()), why=_layout_why(env, arch, lay))
        out = out._replace(megatron=MappingProxyType(lay.to_dict()))
        choices = choices._replace(megatron=words)
    return out._replace(choices=choices)


def _cp_ways(env: Data) -> list[int]:
    """The context-parallel sizes past 1 the plan may choose (megatron.cp_ways): none on FSDP
    (Ulysses SP is its way) or where --megatron gives the layout (its CP is the user's)."""
    t = _map(env, "train")
    if env.get("engine") != "megatron" or t.get("megatron_pinned"):
        return []
    per_node = _int(t, "n_gpus")
    return cp_ways(per_node, per_node * _int(env, "nodes", 1))


def _list(d: Data, key: str) -> list[object]:
    value = d.get(key)
    return list(value) if isinstance(value, (list, tuple, set, frozenset)) else []


def _layouts(env: Data, arch: Arch, cp: int = 1) -> list[Layout | None]:
    """The Megatron layouts to try at context parallelism `cp`, in order (megatron.layouts), or
    the given one; [None] on FSDP."""
    if env.get("engine") != "megatron":
        return [None]
    t = _map(env, "train")
    given = _map(t, "megatron_pinned")
    if given:
        return [_layout(given)]
    per_node = _int(t, "n_gpus")
    found = layouts(arch, per_node, per_node * _int(env, "nodes", 1), cp)
    return list(found) or ([Layout()] if cp == 1 else [])


def _layout_why(env: Data, arch: Arch, lay: Layout) -> str:
    if _map(env, "train").get("megatron_pinned"):
        return "as given (--megatron)"
    what = "the fewest GPUs a model replica spans (TP x PP) whose shard, gradients and optimizer state fit"
    if arch.moe:
        what += f", the {arch.E} experts over as many GPUs of a node as divide them (EP {lay.ep}: {arch.E // lay.ep} a GPU)"
    if lay.cp > 1:
        what += (
            f"; context parallel over {lay.cp} GPUs: one sequence's activations fit no layout at a"
            " smaller CP, at any offload"
        )
    return what


def _offload(train: Data, why: str) -> dict[str, P.Choice]:
    """The offload choices of a train block, with why."""
    return {
        "param_offload": P.Choice(value=bool(train["param_offload"]), why=why),
        "optimizer_offload": P.Choice(value=bool(train["optimizer_offload"]), why=why),
    }


def _trials(env: Data, arch: Arch, pinned: set[str]) -> list[tuple[dict[str, object], dict[str, P.Choice]]]:
    """The train blocks to try, cheapest first, each with why its choices are what they are."""
    t = dict(_map(env, "train"))
    ok = bool(env.get("actor_offload_ok", True))
    t.setdefault("actor_param_offload", bool(t["param_offload"]) and ok)
    given = "as given (--offload)" if "offload" in pinned else "the profile's"
    out = [(t, _offload(t, given))]
    if "offload" not in pinned:
        if not t["optimizer_offload"]:
            t = dict(t, optimizer_offload=True)
            why = "Adam's state offloaded while idle: the resident state does not fit beside the rest"
            out.append((t, _offload(t, why)))
        if not t["param_offload"]:
            t = dict(t, param_offload=True, actor_param_offload=ok)
            out.append(
                (t, _offload(t, "the idle weights and Adam's state offloaded: sharding alone does not fit"))
            )
    if (
        "sequence_parallel" not in pinned
        and env.get("remove_padding", False)
        and env.get("engine") != "megatron"
    ):
        per_node = _int(t, "n_gpus")
        world = per_node * _int(env, "nodes", 1)
        for sp in split_ways(world, arch, per_node)[1:]:
            if _int(t, "train_batch_size") * _int(env, "rollout_n", ROLLOUT_N) % (world // sp) == 0:
                t = dict(t, sequence_parallel=sp)
                choices = _offload(t, "offloaded first: cheaper than splitting sequences")
                choices["sequence_parallel"] = P.Choice(
                    value=sp, why=f"Ulysses over {sp} GPUs: one sequence's activations do not fit one GPU"
                )
                out.append((t, choices))
    return out


def _with_tp(env: Data, arch: Arch, consts: Data, val_rows: int, pinned: set[str]) -> P.MemoryPlan:
    """The plan at the smallest rollout TP whose generation reaches the planned concurrency
    (memory.yaml rollout_seqs_per_gpu, or the whole rollout where it is smaller)."""
    t = _map(env, "train")
    rollout = _str(env, "rollout")
    if rollout != "vllm":
        ways = [1]
    elif "rollout_tp" in pinned:
        ways = [_int(t, "rollout_tp")]
    else:
        ways = split_ways(_int(t, "n_gpus"), arch, _int(t, "n_gpus"))
    best: P.MemoryPlan | None = None
    for tp in ways:
        s = Setup(dict(env, train=dict(t, rollout_tp=tp)), arch, consts, val_rows)
        out = _plan_one(s)
        target = min(s.gen_per_gpu, _int(consts, "rollout_seqs_per_gpu", 1))
        if not out.problems and out.generation_per_gpu >= target:
            best = out
            break
        if best is None or (bool(best.problems), -best.generation_per_gpu) > (
            bool(out.problems),
            -out.generation_per_gpu,
        ):
            best = out
    assert best is not None
    if "rollout_tp" in pinned:
        why = "as given (--rollout-tp)"
    elif rollout != "vllm":
        why = f"the {rollout} rollout generates on each GPU alone"
    else:
        why = (
            f"the smallest of {ways} (GPUs of a node dividing the {arch.a} attention and {arch.k} KV heads) "
            f"whose weight shard, KV cache and sampler hold {best.generation_per_gpu} sequences a GPU"
        )
    return best._replace(choices=best.choices._replace(rollout_tp=P.Choice(value=best.rollout_tp, why=why)))


def _plan_one(s: Setup) -> P.MemoryPlan:
    """The plan of one choice of parallelism and offload."""
    if s.rollout == "vllm":
        s.util = vllm_share(s)
    phases: dict[str, P.Phase] = {}
    batch: dict[str, int] = {}
    bound: dict[str, str] = {}
    problems: list[P.Problem] = []
    for key in BATCHED:
        if key == "critic" and not s.critic:
            continue  # (no critic: nothing to size)
        cands = candidates(s, key)
        budget = round(_draft(s, key, 1)[1], 3)
        best = _largest(cands, lambda b: fits(s, _need(s, key, b), budget, key=key))
        if best is None:
            best = 1
            bound[key] = "does not fit"
        elif cands.index(best) + 1 < len(cands):
            bound[key] = "memory"
        else:
            bound[key] = "profile cap" if best == s.cap(key) else "batch"
        batch[key] = best
        phases[key] = estimate(s, key, best)
    steps = ("actor_step", "critic_step") if s.critic else ("actor_step",)
    for key in steps + (("generate_outside",) if s.rollout == "vllm" else ()):
        phases[key] = estimate(s, key, 0)
    for key, p in phases.items():
        exempt = p.exempt_bytes or 0
        ok = fits(s, p.bytes, p.budget_gib, margin=False, exempt=exempt, key=key)
        phases[key] = p = p._replace(key=key, fits=ok)
        if not ok:  # (the need as fits() compared it: the allocator's overhead added)
            need = ((p.bytes - exempt) * (1 + overhead(s, key)) + exempt) / GIB
            problems.append(P.Problem(phase=p.phase, gib=round(need, 3), budget_gib=p.budget_gib))

    host_plan = host(s)
    if not host_plan.fits:
        problems.append(
            P.Problem(phase="host memory (offload)", gib=host_plan.gib, budget_gib=host_plan.budget_gib)
        )
    g = batch["generation"]
    sizes = P.BatchSizes(
        val_batch_size=g * s.n,
        # (HF: in prompts, each generating rollout.n sequences)
        rollout_micro_batch_size=g // s.rollout_n if s.rollout == "hf" else None,
        # (per engine: a TP group of tp GPUs runs tp × g sequences)
        max_num_seqs=g * s.tp if s.rollout == "vllm" else None,
        log_prob_micro_batch_size_per_gpu=batch["log_prob"],
        actor_ppo_micro_batch_size_per_gpu=batch["actor"],
        critic_ppo_micro_batch_size_per_gpu=batch.get("critic"),
        # validation generates val_per_gpu sequences; between two validations the rollouts
        # generate test_freq × gen_per_gpu: validation stays within validation_share of that
        test_freq=max(1, math.ceil(s.val_per_gpu / (s.gen_per_gpu * s.validation_share))),
    )
    # the process's peak (vLLM's engine phase is inside its share, counted by generate_outside)
    in_process = [p for k, p in phases.items() if not (k == "generation" and s.rollout == "vllm")]
    peak = max(in_process, key=lambda p: p.bytes)
    return P.MemoryPlan(
        model=s.arch.name,
        arch=_plan_arch(s),
        gpu_total_gib=round(s.total_gib, 2),
        cuda_context_gib=s.cuda_context_gib,
        nccl_gib=s.nccl_gib if s.n > 1 else 0,
        usable_gib=round(s.usable_gib, 2),
        allocator_overhead=s.alloc_overhead,
        hf_generate_overhead=s.hf_overhead,
        margin=s.margin,
        vllm_share_gib=round(s.util * s.total_gib, 2) if s.rollout == "vllm" else None,
        sequence=P.Sequence(prompt=s.prompt, response=s.response),
        validation_rows=s.val_rows,
        rollout_n=s.rollout_n,
        rollout_batch_per_gpu=s.gen_per_gpu,
        mini_batch_per_gpu=s.mini_per_gpu,
        phases=tuple(phases.values()),
        peak=P.Peak(phase=peak.phase, gib=peak.total_gib),
        batch=sizes,
        bound_by=MappingProxyType(bound),
        problems=tuple(problems),
        generation_per_gpu=g,
        rollout_tp=s.tp,
        sequence_parallel=s.sp,
        host=host_plan,
        choices=P.Choices(
            gpu_memory_utilization=P.Choice(
                value=s.util,
                why=(
                    f"planned: what the resident roles leave on the card while vLLM generates, "
                    f"at most the profile's {s.max_util:g}"
                )
                if s.rollout == "vllm"
                else f"unused: the {s.rollout} rollout has no engine share",
            ),
            sequence_parallel=P.Choice(value=s.sp, why="one sequence's activations fit one GPU")
            if s.sp == 1
            else P.Choice(value=s.sp, why="as given (--sp)"),
        ),
    )


def _plan_arch(s: Setup) -> P.PlanArch:
    """The model's shape as the plan counted it."""
    a = s.arch
    return P.PlanArch(
        layers=a.L,
        hidden_size=a.H,
        attention_heads=a.a,
        kv_heads=a.k,
        head_dim=a.d,
        intermediate_size=a.I,
        experts=a.E if a.moe else None,
        experts_per_token=a.topk if a.moe else None,
        moe_intermediate_size=a.Ie if a.moe else None,
        vocab_size=a.V,
        tied_embeddings=a.tied,
        parameters=a.params(),
        critic_parameters=a.critic_params() if s.critic else 0,
        lora_parameters=a.lora_params(s.lora) if s.lora else 0,
    )


def setup(env: Data, arch_rec: Data, consts: Data, val_rows: int) -> Setup:
    """The estimate's view of a resolved environment (for `estimate` at chosen batches)."""
    return Setup(env, Arch(_str(_map(env, "train"), "model"), arch_rec), consts, val_rows)
