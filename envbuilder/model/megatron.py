"""verl's Megatron engine: its parallel layout and what each GPU holds under it.

Megatron splits a model four ways (megatron-core's parallel_state): tensor parallelism (TP:
each layer's matrices over tp GPUs of a node, with sequence parallelism splitting the
activations between them), pipeline parallelism (PP: the layers in pp stages), expert
parallelism (EP: a mixture of experts' experts over ep GPUs, each expert whole with an expert
tensor parallelism of 1) and context parallelism (CP: one sequence over cp GPUs). What is left
is data parallelism: dp = world / (tp × pp × cp) ranks for the dense part, edp = world /
(ep × etp × pp) for the experts. verl's megatron actor and critic run with
`use_distributed_optimizer=True` (McoreEngineConfig), so the fp32 main weights and Adam's two
moments are sharded over those data-parallel ranks, while the bf16 weights and the fp32 main
gradients (McoreOptimizerConfig main_grads_dtype: fp32) are each GPU's whole model-parallel shard.

Per GPU, with P the parameters of the shard a GPU holds (the dense part / (tp × pp), the
experts / (ep × etp × pp); the embedding and an untied lm_head on their stages, / tp):
  weights          2 B × P                           (bf16 parameters)
  gradients        4 B × P                           (fp32 main gradients)
  optimizer        12 B × P / data-parallel ranks     (fp32 main weights, exp_avg, exp_avg_sq)
  reference        2 B × P                           (the reference model, bf16, same layout)
Activations: sequence parallelism splits every layer's activations over the TP group and the
vocabulary-parallel logits are split the same way, so a micro-batch's working set is the
unsplit one / (tp × cp); a pipeline stage holds at most pp micro-batches in flight (1F1B) of
L / pp layers each: the same as one micro-batch through all L layers.
"""

from __future__ import annotations

from envbuilder.model.arch import Arch
from envbuilder.model.resolved import MegatronLayout as Layout  # noqa: F401  (re-exported: the layout)

__all__ = ["Layout", "cp_ways", "fits_model", "layouts", "shard_params"]


def shard_params(a: Arch, lay: Layout, params: int) -> tuple[float, float]:
    """(dense, expert) parameters on one GPU of `params` (the actor's or the critic's count):
    the decoder layers of one pipeline stage split by TP (experts by EP × ETP), and the
    embedding and lm_head, each on its stage, split by TP (both on the one stage where pp = 1)."""
    experts = a.expert_params()
    root = params - a.decoder_params()  # (embeddings, final norm, lm_head or value head)
    dense_layers = a.decoder_params() - experts
    if lay.pp > 1:  # the embedding on the first stage, the head on the last: the larger one
        root = max(a.V * a.H, root - a.V * a.H)
    dense = dense_layers / (lay.tp * lay.pp) + root / lay.tp
    return dense, experts / (lay.ep * lay.etp * lay.pp)


def fits_model(a: Arch, lay: Layout, per_node: int, world: int) -> str | None:
    """Why megatron-core and verl refuse `lay` for this model and world, or None."""
    if per_node % lay.tp:
        return f"TP {lay.tp} does not divide the {per_node} GPUs of a node"
    if a.a % lay.tp or a.k % lay.tp:
        return f"TP {lay.tp} does not divide the {a.a} attention and {a.k} KV heads (query groups)"
    if a.L % lay.pp:
        return f"PP {lay.pp} does not divide the {a.L} layers"
    if world % lay.model_parallel:
        return f"TP × PP × CP = {lay.model_parallel} does not divide the {world} GPUs"
    if lay.ep > 1 and (not a.moe or a.E % lay.ep):
        return f"EP {lay.ep} does not divide the {a.E} experts" if a.moe else "EP needs a mixture of experts"
    if world % (lay.ep * lay.etp * lay.pp):
        return f"EP × ETP × PP = {lay.ep * lay.etp * lay.pp} does not divide the {world} GPUs"
    return None


def layouts(a: Arch, per_node: int, world: int, cp: int = 1) -> list[Layout]:
    """Every layout megatron-core accepts for this model and world at context parallelism `cp`,
    in the order the plan tries them: the fewest GPUs per model replica first (TP × PP: the
    least communication on the critical path), TP before PP at the same product (TP stays inside
    a node's NVLink, PP's bubbles cost time), and for a mixture of experts the experts spread as
    widely as the world allows within a node (EP's all-to-all on NVLink; fewer experts a GPU).
    With cp > 1, TP × CP divides the node's GPUs: megatron-core orders the ranks TP, CP, EP,
    DP, PP (parallel_state's default order "tp-cp-ep-dp-pp"), so each CP group, whose ring
    passes every attention layer's keys and values around, then stays inside a node."""
    tps = [t for t in range(1, per_node + 1) if per_node % (t * cp) == 0]
    pps = [p for p in range(1, a.L + 1) if a.L % p == 0 and p <= world]
    eps = [e for e in range(1, min(a.E, per_node) + 1) if a.E % e == 0] if a.moe else [1]
    out = [
        Layout(tp=t, pp=p, ep=e, cp=cp)
        for t in tps
        for p in pps
        for e in eps
        if fits_model(a, Layout(tp=t, pp=p, ep=e, cp=cp), per_node, world) is None
    ]
    return sorted(out, key=lambda lay: (lay.tp * lay.pp, lay.pp, -lay.ep))


def cp_ways(per_node: int, world: int) -> list[int]:
    """The context-parallel sizes the plan tries past CP 1, smallest first: those dividing a
    node's GPUs (the ring within NVLink, see layouts) and the world (TP × PP × CP × DP = world).
    megatron-core's load balancing splits each sequence into 2 × CP chunks, so its length must
    divide by 2 × CP (× TP with sequence parallelism); verl 0.9.1 pads every sequence to that
    multiple itself, on both of its engine's input paths (verl/models/mcore/util.py:
    preprocess_packed_seqs, the remove-padding "thd" path, align_size = tp × cp × 2, line 77;
    preprocess_bshd_engine, the padded "bshd" path, line 690), so the profile's lengths need
    no check; only dynamic CP needs use_remove_padding (workers/engine/megatron/
    transformer_impl.py:113-116), and the plan sets a static context_parallel_size."""
    return [c for c in range(2, per_node + 1) if per_node % c == 0 and world % c == 0]
