"""What every family's plots share: matplotlib without a screen, and the same markers and dashes."""

from __future__ import annotations

from pathlib import Path

MARKERS = ["o", "s", "^", "v", "D", "x", "P", "*"]
DASHES = ["-", "--", ":", "-."]


def pyplot():
    """matplotlib.pyplot on the Agg backend (headless), imported on first use: a site process
    or a run without plots never loads matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def colors() -> list[str]:
    return pyplot().rcParams["axes.prop_cycle"].by_key()["color"]
