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


def profile_named(m: Matrix, typed: str) -> Named | None:
    """The profile a typed name means, or None when it names none."""
    if typed in m.profiles:
        return Named(typed)
    folded = {k.casefold(): k for k in m.profiles}
    if typed.casefold() in folded:
        return Named(folded[typed.casefold()])
    # a card's name is words of letters, digits and . _ + / ( ) - ; anything else (a control
    # character, a quote) names no card, however a pattern would find a card's name inside it
    gpu = match_gpu(m, typed) if re.fullmatch(r"[A-Za-z0-9 ._+/()-]{1,100}", typed) else None
    profile = nearest_profile(m, gpu) if gpu else None
    if gpu is None or profile is None:
        return None
    own = m.profiles[profile]["gpu"]
    if gpu == own:
        return Named(profile, None, f"{typed!r} is the {m.gpus[gpu]['name']}, profile {profile}'s GPU")
    return Named(
        profile,
        gpu,
        f"{typed!r} is the {m.gpus[gpu]['name']}: profile {profile} (the {m.gpus[own]['name']}'s, "
        f"CC {m.gpus[own]['compute_capability']}), planned for the {m.gpus[gpu]['name']}'s memory",
    )
