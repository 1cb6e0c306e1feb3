"""Parsing of the scenario options that are more than a number (Locust-free, so tests import it)."""

from __future__ import annotations

SCENARIOS = ("agent", "ide", "rag", "chat")
DEFAULT_MIX = "agent=4,ide=3,rag=2,chat=1"


def parse_range(text: str, name: str) -> tuple[float, float]:
    """'LO,HI' seconds, 0 <= LO <= HI."""
    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"{name} must be LO,HI seconds, got {text!r}") from None
    if not 0 <= low <= high:
        raise ValueError(f"{name} must satisfy 0 <= LO <= HI, got {text!r}")
    return low, high


def parse_mix(text: str) -> dict[str, int]:
    """'agent=4,ide=3' -> weights per scenario; scenarios left out weigh 0; at least one > 0."""
    weights = dict.fromkeys(SCENARIOS, 0)
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in weights:
            raise ValueError(f"--mix: unknown scenario {name!r} (known: {', '.join(SCENARIOS)})")
        try:
            weights[name] = int(value)
        except ValueError:
            raise ValueError(f"--mix: weight of {name!r} must be an integer, got {value!r}") from None
        if weights[name] < 0:
            raise ValueError(f"--mix: weight of {name!r} must be >= 0, got {weights[name]}")
    if not any(weights.values()):
        raise ValueError(f"--mix needs a scenario with a positive weight, got {text!r}")
    return weights
