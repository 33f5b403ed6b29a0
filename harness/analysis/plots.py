"""What every wirebench plot shares: matplotlib without a screen, and one color per arm."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (files and data URIs, never a screen), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def arm_colors(labels: Sequence[str]) -> dict[str, Any]:
    """One tab10 color per arm, in the order given (the reference first), the same in every plot."""
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {label: cmap(i % 10) for i, label in enumerate(labels)}
