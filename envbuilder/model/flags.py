"""The override flags, declared once: each field of `Overrides` with the flag a user types for
it, the kind of value it takes and its help. The click options (cli/options.py), the Overrides
the flags make (profiles.py), the command a rendered README says wrote it, `launch`'s `envbuild
build` lines and the fixes a refusal offers (fixes.py) are all read from here, so a flag spelled
once is spelled the same everywhere, and a README's command parses back to the same Overrides.

    words(Overrides(verl="0.5.0", with_=("apex",)))   # ['--verl', '0.5.0', '--with', 'apex']
"""

from __future__ import annotations

from envbuilder.model.components import registry as COMPONENTS
from envbuilder.model.matrix_schema import ROLLOUTS
from envbuilder.record import Record
from envbuilder.model.resolved import GPU_MEMORY_MIB, Overrides

# the kinds of value: a string, a whole number, a comma list (repeatable), a switch, a choice
TEXT, INT, NAMES, SWITCH, CHOICE = "text", "int", "names", "switch", "choice"
# what --offload names: the idle weights, Adam's state, or nothing
OFFLOAD = ("params", "optimizer", "none")
# the largest LoRA rank vLLM serves (vllm/config/lora.py MaxLoRARanks, which verl 0.9.1's
# get_vllm_max_lora_rank rounds a rank up to; a larger one raises there)
LORA_RANK_MAX = 512
# the bounds of --max-prompt-length and --max-response-length (tokens): a million bounds a typo;
# the model's own context (max_position_embeddings, the model-context rule) bounds the run
SEQ_MIN, SEQ_MAX = 16, 1 << 20


class Flag(Record):
    field: str  # Overrides' field
    flag: str  # as typed: --gpus-per-node
    kind: str
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] = ()  # CHOICE
    bounds: tuple[int, int] | None = None  # INT
    fix: bool = False  # a refusal's fix may offer it (fixes.FIX_FLAG)

    @property
    def param(self) -> str:
        """click's parameter name: the field (`torch_` keeps `--torch` off the module's name)."""
        return "torch_" if self.field == "torch" else self.field


FLAGS: tuple[Flag, ...] = (
    Flag("cuda", "--cuda", TEXT, "CUDA toolkit of the image, e.g. 12.4.", fix=True),
    Flag("torch", "--torch", TEXT, "torch release, e.g. 2.6.0.", "VERSION", fix=True),
    Flag("python", "--python", TEXT, "Python, e.g. 3.10.", fix=True),
    Flag("verl", "--verl", TEXT, "verl, e.g. 0.4.1.", fix=True),
    Flag("rollout", "--rollout", CHOICE, "Rollout backend.", choices=ROLLOUTS, fix=True),
    Flag("vllm", "--vllm", TEXT, "vLLM release.", fix=True),
    Flag(
        "with_",
        "--with",
        NAMES,
        f"Add optional components: {COMPONENTS.listed()} (comma-separated).",
        "NAMES",
        fix=True,
    ),
    Flag(
        "without",
        "--without",
        NAMES,
        f"Leave components out: {COMPONENTS.listed()} (comma-separated).",
        "NAMES",
        fix=True,
    ),
    Flag(
        "driver",
        "--driver",
        TEXT,
        "Check against this NVIDIA driver version, e.g. 550.54.14.",
        "VERSION",
        fix=True,
    ),
    Flag(
        "allow_unsupported",
        "--allow-unsupported",
        SWITCH,
        "Render below a hardware floor, warnings in the files.",
    ),
    Flag(
        "model",
        "--model",
        TEXT,
        "Train this model: a hub repo id (its config.json is read through "
        "--mirror's hub or HF_ENDPOINT, then cached) or a folder with its config.json. The memory "
        "plan, batch sizes and run script follow its shape.",
        "HF_ID|FOLDER",
        fix=True,
    ),
    Flag(
        "algo",
        "--algo",
        TEXT,
        "verl's advantage estimator: gae (PPO with a critic, the default), grpo, "
        "rloo, reinforce_plus_plus, remax, ... (`envbuild show PROFILE` lists the "
        "release's); the run script, critic and memory plan follow it.",
        "ESTIMATOR",
        fix=True,
    ),
    Flag(
        "nodes",
        "--nodes",
        INT,
        "Train across this many nodes (a Ray cluster); default 1.",
        bounds=(1, 1024),
        fix=True,
    ),
    Flag(
        "gpus_per_node",
        "--gpus-per-node",
        INT,
        "GPUs on each node (default: the profile's count). The memory plan shards over nodes x GPUs.",
        bounds=(1, 64),
        fix=True,
    ),
    Flag(
        "rollout_tp",
        "--rollout-tp",
        INT,
        "GPUs of a node each vLLM engine is split over (tensor parallelism; it divides the GPUs "
        "a node has and the model's heads). Default: the smallest whose weight shard, KV cache "
        "and sampler fit.",
        "N",
        bounds=(1, 64),
        fix=True,
    ),
    Flag(
        "offload",
        "--offload",
        NAMES,
        "Keep what is idle in host memory: params, optimizer (comma-separated), or none. "
        "Default: the profile's, and what the memory plan needs to fit.",
        "params,optimizer|none",
        fix=True,
    ),
    Flag(
        "sp",
        "--sp",
        INT,
        "Ulysses sequence parallelism: split each sequence over N GPUs (it divides the GPUs a "
        "node has and the attention heads; needs remove padding). Default: 1 unless one "
        "sequence does not fit.",
        "N",
        bounds=(1, 64),
        fix=True,
    ),
    Flag(
        "engine",
        "--engine",
        CHOICE,
        "verl's training engine: fsdp (the default) or megatron (megatron-core, TransformerEngine "
        "and mbridge installed; tensor, pipeline and expert parallelism planned for the model).",
        choices=("fsdp", "megatron"),
        fix=True,
    ),
    Flag(
        "megatron",
        "--megatron",
        NAMES,
        "With --engine megatron: the layout, e.g. tp=2,pp=1,ep=8 (tensor, pipeline, expert, "
        "context parallel). Default: the fewest GPUs a model replica spans that fit.",
        "tp=N,pp=N,ep=N,cp=N",
        fix=True,
    ),
    Flag(
        "host_memory",
        "--host-memory",
        INT,
        "Host memory (GiB) of each node that offload may fill. Default: the profile's, else 64 GiB a GPU.",
        "GiB",
        bounds=(1, 1 << 20),
        fix=True,
    ),
    Flag(
        "lora_rank",
        "--lora-rank",
        INT,
        "Train LoRA adapters of this rank (e.g. 32) in place of every weight: the frozen base needs "
        "no gradients or Adam state, and the reference is the actor without its adapters. "
        "0 trains every weight. Default: the profile's.",
        "N",
        bounds=(0, LORA_RANK_MAX),
        fix=True,
    ),
    Flag(
        "max_prompt_length",
        "--max-prompt-length",
        INT,
        "The longest prompt in tokens (verl's data.max_prompt_length; longer prompts are filtered "
        "out). Default: the profile's. The memory plan, token budgets and vLLM's max_model_len follow.",
        "TOKENS",
        bounds=(SEQ_MIN, SEQ_MAX),
        fix=True,
    ),
    Flag(
        "max_response_length",
        "--max-response-length",
        INT,
        "The longest response in tokens (verl's data.max_response_length). Default: the profile's. "
        "Prompt + response must fit the model's context; the memory plan follows.",
        "TOKENS",
        bounds=(SEQ_MIN, SEQ_MAX),
        fix=True,
    ),
    Flag(
        "interconnect",
        "--interconnect",
        TEXT,
        "How the GPUs talk: nvlink or pcie inside a node; ib, roce or tcp "
        "between nodes (default tcp with --nodes above 1). Sets NCCL's variables.",
        "nvlink|pcie|ib|roce|tcp",
        fix=True,
    ),
    Flag(
        "ecc",
        "--ecc",
        CHOICE,
        "Plan memory for the board with ECC on (GDDR datacenter boards' default, "
        "which costs memory) or off (nvidia-smi -e 0 and a reboot).",
        choices=("on", "off"),
        fix=True,
    ),
    Flag(
        "gpu_memory",
        "--gpu-memory",
        INT,
        "Plan for a card of this size as nvidia-smi prints it (e.g. 40960: an A100 40GB).",
        "MiB",
        bounds=GPU_MEMORY_MIB,
    ),
    Flag(
        "flash_attn_index",
        "--flash-attn-index",
        TEXT,
        "Take flash-attn's wheel from this PEP 503 index first (its /simple/ URL); "
        "without a wheel there the builder compiles it.",
        "URL",
    ),
)

BY_FIELD = {f.field: f for f in FLAGS}
BY_FLAG = {f.flag: f for f in FLAGS}
# click's parameter names -> Overrides' fields
FLAG_FIELDS = {f.param: f.field for f in FLAGS}


def words(ov: Overrides, **changes: object) -> list[str]:
    """The flags that give `ov` (with `changes` to its fields), as a user types them again, in the
    order of their spelling: a switch alone, a list comma-joined, each value one word (quote them
    for where they land)."""
    given = ov._replace(**changes) if changes else ov
    out: list[str] = []
    for f in sorted(FLAGS, key=lambda f: f.flag):
        value: object = getattr(given, f.field)
        if value is None or value == () or value is False:
            continue
        if f.kind == SWITCH:
            out.append(f.flag)
        elif f.kind == NAMES and isinstance(value, (tuple, list)):  # (a tuple of names)
            out += [f.flag, ",".join(value)]
        else:
            out += [f.flag, str(value)]
    return out


def spell(field: str, value: object = None) -> str:
    """One flag as a hint writes it: `--gpus-per-node 8`, `--allow-unsupported`."""
    f = BY_FIELD[field]
    if value is None or f.kind == SWITCH:
        return f.flag
    return f"{f.flag} {','.join(value) if isinstance(value, (tuple, list)) else value}"
