"""The shape of `envbuild verify`'s report, one profile's (`--json` prints these, the table reads
them): what machine/verify.py fills in as the run goes, and the entries of its lists. Plain
dicts at run time (TypedDicts), so the JSON keeps its keys and their order."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from typing_extensions import NotRequired


class PipCheck(TypedDict):
    ok: bool
    problems: list[str]


class LayerEntry(TypedDict):
    """One Dockerfile layer (a layer this profile has none of: `empty`, no `error`)."""

    layer: str
    requirements: list[str]
    ok: bool
    seconds: float
    error: NotRequired[str | None]
    empty: NotRequired[bool]
    pip_check: PipCheck | None


class Patches(TypedDict):
    ok: bool
    names: list[str]
    output: list[str]
    error: NotRequired[str]


class Audit(TypedDict):
    ok: bool
    output: list[str]


class NotInstalled(TypedDict):
    """A compiled component left out, and why (install's entries name no `modules`)."""

    component: str
    version: str
    modules: NotRequired[list[str]]
    why: str


class Compiled(TypedDict):
    """A Compile step verify did itself (TransformerEngine with PyPI's CUDA compiler)."""

    component: str
    version: str
    arch: str
    ok: bool
    toolchain: NotRequired[list[str]]
    toolchain_seconds: NotRequired[float]
    seconds: NotRequired[float]
    jobs: NotRequired[int]
    error: NotRequired[str]


class ImportEntry(TypedDict):
    module: str
    ok: bool
    seconds: float
    error: str | None
    needs: NotRequired[str]  # the compiled component a failed import needs


class Mismatch(TypedDict):
    override: str
    composed: str | None  # the config's value as JSON; None: the config lacks the key


class Validation(TypedDict):
    """verl's validate_config (`validated`, `why`: as the child printed them) and the batch
    arithmetic's violations."""

    validated: object
    why: NotRequired[object]
    violations: NotRequired[list[str]]


class Compose(TypedDict, total=False):
    """The run script's overrides composed with verl's Hydra config (`skipped` alone under
    --skip-compose)."""

    skipped: str
    ok: bool
    checked: int
    mismatches: list[Mismatch]
    error: str | None
    seconds: float
    overrides: int
    values: dict[str, object]
    validation: Validation


class VerifyReport(TypedDict):
    """One profile's report (verify.Report.as_dict; verify_all adds `gpu_step`)."""

    profile: str
    python: str
    ok: bool
    interpreter: str | None
    index_url: str | None
    torch_index_url: str | None
    torch_swapped: str | None
    constraints: bool
    libcuda: str | None
    isolation: str | None
    layers: list[LayerEntry]
    patches: Patches | None
    audit: Audit | None
    not_installed: list[NotInstalled]
    compiled: list[Compiled]
    imports: list[ImportEntry]
    compose: Compose | None
    failures: list[str]
    venv: str | None
    seconds: float
    gpu_step: NotRequired[str]
