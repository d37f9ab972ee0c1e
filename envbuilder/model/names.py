"""The names people type for a profile or a card: the profile's own key in any case (`H100`),
a marketed name (`RTX 4090`, `A100 40GB`) or the name nvidia-smi prints (`NVIDIA GeForce RTX
5090`, `A100-SXM4-40GB`). A card's name is matched by gpus.yaml's `match` patterns, the same
ones `detect` reads nvidia-smi's names with; a card without a profile of its own takes the
profile of the nearest GPU its code runs on (the same compute capability, the closest size)."""

from __future__ import annotations

import re

from envbuilder.model.matrix import Matrix, cc_tuple
from envbuilder.record import Record


class Named(Record):
    profile: str
    gpu: str | None = None  # the matrix's card the name named, where it is not the profile's own
    why: str = ""


def match_gpu(m: Matrix, name: str) -> str | None:
    """The first matrix GPU model whose `match` pattern finds the name (case-insensitive)."""
    for key, gpu in m.gpus.items():
        if any(re.search(p, name, re.IGNORECASE) for p in gpu["match"]):
            return key
    return None


def nearest_profile(m: Matrix, gpu_key: str) -> str | None:
    """The profile for a card: its own; else one whose GPU has its compute capability, the
    closest in memory."""
    own = [n for n, p in m.profiles.items() if p["gpu"] == gpu_key]
    if own:
        return own[0]
    card = m.gpus[gpu_key]
    machine = card.get("machine", "x86_64")  # (a PCIe H100 NVL is no Grace host)
    same = [
        n
        for n, p in m.profiles.items()
        if cc_tuple(m.gpus[p["gpu"]]["compute_capability"]) == cc_tuple(card["compute_capability"])
        and m.gpus[p["gpu"]].get("machine", "x86_64") == machine
    ]
    return min(
        same, key=lambda n: abs(m.gpus[m.profiles[n]["gpu"]]["vram_gb"] - card["vram_gb"]), default=None
    )


def _card_named(m: Matrix, typed: str) -> str | None:
    """The matrix card a typed name names. A card's name is words of letters, digits and
    . _ + / ( ) - ; anything else (a control character, a quote) names no card, however a
    pattern would find a card's name inside it."""
    return match_gpu(m, typed) if re.fullmatch(r"[A-Za-z0-9 ._+/()-]{1,100}", typed) else None


# the words before a card's model in its names, which a user leaves off (`RTX 3090`)
_MAKER = re.compile(r"^(NVIDIA\s+)?(GeForce\s+|Tesla\s+)?", re.IGNORECASE)


def unknown_name_hint(m: Matrix, typed: str) -> str:
    """What a refusal of a name that names no profile says first: for a card of the matrix
    without a profile (a grid row), that card and where to see it; else 'did you mean ...? '
    for the closest profile key or card name (with the card's profile), or nothing."""
    import difflib

    gpu = _card_named(m, typed)
    if gpu is not None:
        card = m.gpus[gpu]
        return (
            f"{typed!r} is the {card['name']} (CC {card['compute_capability']}), a card no profile's "
            f"build runs on (`envbuild grid --gpu {gpu}` shows it). "
        )
    names: dict[str, tuple[str, str]] = {k.casefold(): (k, k) for k in m.profiles}  # folded: (shown, profile)
    for key, card in m.gpus.items():
        profile = nearest_profile(m, key)
        for name in (key, card["name"], _MAKER.sub("", card["name"])):
            if profile:
                names.setdefault(name.casefold(), (name, profile))
    close = difflib.get_close_matches(typed.casefold(), list(names), n=1, cutoff=0.5)
    if not close:
        return ""
    shown, profile = names[close[0]]
    return f"did you mean {shown!r}{'' if shown == profile else f' (profile {profile})'}? "


def profile_named(m: Matrix, typed: str) -> Named | None:
    """The profile a typed name means, or None when it names none."""
    if typed in m.profiles:
        return Named(typed)
    folded = {k.casefold(): k for k in m.profiles}
    if typed.casefold() in folded:
        return Named(folded[typed.casefold()])
    keys = {k.casefold(): k for k in m.gpus}  # (a card's key names it: `h100-nvl`, which the grid prints)
    gpu = keys.get(typed.casefold()) or _card_named(m, typed)
    profile = nearest_profile(m, gpu) if gpu else None
    if gpu is None or profile is None:
        return None
    own = m.profiles[profile]["gpu"]
    if gpu == own:
        return Named(profile, None, f"{typed!r} is the {m.gpus[gpu]['name']}, profile {profile}'s GPU")
    card = m.gpus[gpu]
    return Named(
        profile,
        gpu,
        f"{typed!r} is the {card['name']} (CC {card['compute_capability']}), which has no profile "
        f"of its own: it takes profile {profile}'s stack (built for CC "
        f"{m.gpus[own]['compute_capability']}), planned for the {card['name']}'s own memory",
    )


def suggest(name: str, known: list[str]) -> str:
    """'did you mean ...? ' for the known name closest to `name`, compared without case (`H10`
    is close to h100, not to v100)."""
    import difflib

    folded = {k.casefold(): k for k in known}
    close = difflib.get_close_matches(name.casefold(), list(folded), n=1, cutoff=0.5)
    return f"did you mean {folded[close[0]]!r}? " if close else ""
