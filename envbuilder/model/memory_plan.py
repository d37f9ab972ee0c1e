"""The memory plan as records: what memory.plan() works out and the resolved environment keeps
as `memory` (envbuild.json's `memory` object: each record's fields are its keys).

Declared once, here: the type of each value, and (`Annotated`) the kind envbuild.json is checked
against (resolved.field_spec derives it; schema.py `S`, matrix_schema.py `K`). Code reads
attributes; `plan[key]` and `plan.get(key)` (PlanRecord) stay for code written against the
plain plan (the tests and bench scripts, and readers not yet moved to attributes)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Annotated, Any

from envbuilder.record import Record

if TYPE_CHECKING:  # (the kinds in the annotations: read by resolved.field_spec, which imports them)
    from envbuilder.model import matrix_schema as K
    from envbuilder.model import schema as S


class PlanRecord(Record):
    """A record of the plan, also read by its JSON keys as the plain plan was: `rec[key]`,
    `rec.get(key, default)`, `key in rec` (a field left out of the JSON while None is absent)."""

    def _field(self, key: str) -> str | None:
        """The field of a JSON key (the plan's are its fields' names), None where its JSON has none."""
        if key not in self._fields or (key in self._omit_none and getattr(self, key) is None):
            return None
        return key

    def __getitem__(self, key: str) -> Any:
        f = self._field(key)
        if f is None:
            raise KeyError(key)
        return getattr(self, f)

    def get(self, key: str, default: Any = None) -> Any:
        f = self._field(key)
        return default if f is None else getattr(self, f)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._field(key) is not None

    def keys(self) -> list[str]:
        return [f for f in self._fields if self._field(f)]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())


class Term(PlanRecord):
    """One line of a phase's budget. kind: `state` (the working role's weights, gradients,
    optimizer), `resident` (what the other roles leave on the GPU meanwhile), `work` (the batch's
    working set), `host` (offloaded to the host's memory)."""

    term: Annotated[str, S.Text(1000)]
    formula: Annotated[str, S.Text(1000)]
    gib: float
    kind: Annotated[str, S.Text(1000)]
    bytes: int


class Phase(PlanRecord):
    """One phase at its planned batch: its terms and total against its budget. `key` names the
    batch it sizes (generation, log_prob, actor, critic) or the phase (actor_step, ...)."""

    phase: Annotated[str, S.Text(1000)]
    batch: int | None
    terms: tuple[Term, ...]
    total_gib: float
    bytes: int
    budget_gib: float
    key: Annotated[str, S.Text(1000)] = ""
    fits: bool = True
    # vLLM's share (generate_outside): bytes already whole, which take no allocator overhead
    exempt_bytes: int | None = None

    _omit_none = ("exempt_bytes",)


class Peak(PlanRecord):
    phase: Annotated[str, S.Text(200)]
    gib: Annotated[float, K.GIB]


class Sequence(PlanRecord):
    prompt: int
    response: int


class PlanArch(PlanRecord):
    """The model's shape as the plan counted it (a mixture of experts adds its expert fields)."""

    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool
    parameters: int
    critic_parameters: int
    lora_parameters: int
    experts: int | None = None
    experts_per_token: int | None = None
    moe_intermediate_size: int | None = None

    _omit_none = ("experts", "experts_per_token", "moe_intermediate_size")


class BatchSizes(PlanRecord):
    """The run script's batch sizes (None where the run has none: the HF rollout's micro-batch
    on vLLM, vLLM's max_num_seqs on the HF rollout, the critic's for an estimator without one)."""

    val_batch_size: Annotated[int, K.COUNT]
    rollout_micro_batch_size: Annotated[int | None, K.COUNT]
    max_num_seqs: Annotated[int | None, K.COUNT]
    log_prob_micro_batch_size_per_gpu: Annotated[int, K.COUNT]
    actor_ppo_micro_batch_size_per_gpu: Annotated[int, K.COUNT]
    critic_ppo_micro_batch_size_per_gpu: Annotated[int | None, K.COUNT]
    test_freq: Annotated[int, K.COUNT]

    def sizes(self) -> dict[str, int | None]:
        """Each size by its name (the JSON's keys)."""
        return {
            "val_batch_size": self.val_batch_size,
            "rollout_micro_batch_size": self.rollout_micro_batch_size,
            "max_num_seqs": self.max_num_seqs,
            "log_prob_micro_batch_size_per_gpu": self.log_prob_micro_batch_size_per_gpu,
            "actor_ppo_micro_batch_size_per_gpu": self.actor_ppo_micro_batch_size_per_gpu,
            "critic_ppo_micro_batch_size_per_gpu": self.critic_ppo_micro_batch_size_per_gpu,
            "test_freq": self.test_freq,
        }


class Problem(PlanRecord):
    """A phase (or the host's memory) that does not fit: what it needs against its budget."""

    phase: Annotated[str, S.Text(1000)]
    gib: float
    budget_gib: float


class Host(PlanRecord):
    """What offload keeps in a node's host memory, against --host-memory (or memory.yaml's)."""

    terms: tuple[Term, ...]
    gpus_per_node: int
    gib: float
    budget_gib: float
    fits: bool


class Choice(PlanRecord):
    """What the plan chose for one setting (a number, true/false), and why."""

    value: Annotated[bool | int | float, S.Scalar()]
    why: Annotated[str, S.Text(1000)]


class LayoutChoice(PlanRecord):
    """The Megatron layout the plan chose ({tp, pp, ep, cp}), and why."""

    value: Annotated[Mapping[str, int], S.MapOf(int, key=S.Text(100))]
    why: Annotated[str, S.Text(1000)]


class Choices(PlanRecord):
    """The plan's choices, cheapest first (memory.plan); `megatron` on that engine only."""

    gpu_memory_utilization: Choice
    sequence_parallel: Choice
    rollout_tp: Choice | None = None
    param_offload: Choice | None = None
    optimizer_offload: Choice | None = None
    megatron: LayoutChoice | None = None

    _omit_none = ("rollout_tp", "param_offload", "optimizer_offload", "megatron")


class Card(PlanRecord):
    """The card's memory the plan counts on (sizing.card_size) and what its ECC does to it."""

    mib: int
    ecc: Annotated[str, S.Text(1000)]
    why: Annotated[str, S.Text(1000)]


class MemoryPlan(PlanRecord):
    """The memory budget per GPU and the batch sizes of a resolved profile (memory.plan)."""

    model: Annotated[str, S.Text(1000)]
    arch: PlanArch
    gpu_total_gib: float
    cuda_context_gib: float
    nccl_gib: float
    usable_gib: Annotated[float, K.GIB]
    allocator_overhead: float
    hf_generate_overhead: float
    margin: float
    vllm_share_gib: float | None
    sequence: Sequence
    validation_rows: int
    rollout_n: int
    rollout_batch_per_gpu: int
    mini_batch_per_gpu: int
    phases: tuple[Phase, ...]
    peak: Peak
    batch: BatchSizes
    bound_by: Annotated[Mapping[str, str], S.MapOf(S.Text(1000), key=S.Text(100))]
    problems: tuple[Problem, ...]
    generation_per_gpu: int
    rollout_tp: int
    sequence_parallel: int
    host: Host
    choices: Choices
    # the Megatron engine's layout (tp, pp, ep, cp), the plans tried where none fits, and the
    # card (the resolver's: memory.plan leaves it out)
    megatron: Annotated[Mapping[str, int] | None, S.MapOf(int, key=S.Text(100))] = None
    tried: int | None = None
    card: Card | None = None

    _omit_none = ("megatron", "tried", "card")
