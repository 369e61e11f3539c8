"""The reward curve: a plain-text chart for terminals and a PNG (matplotlib, optional).

Per-step rewards are noisy (one batch each), so both draw the per-step values binned to
the chart width, plus validation points where there are any.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from pathlib import Path

from osmosis_ai.train.events import EvalSummary

_BLOCKS = " ▁▂▃▄▅▆▇█"


def binned(values: Sequence[float | None], bins: int) -> list[float | None]:
    """Mean of the finite values in each of ``bins`` equal slices (``None`` when empty)."""
    count = len(values)
    if count == 0 or bins < 1:
        return []
    bins = min(bins, count)
    out: list[float | None] = []
    for b in range(bins):
        part = [
            v
            for v in values[b * count // bins : (b + 1) * count // bins]
            if v is not None and math.isfinite(v)
        ]
        out.append(sum(part) / len(part) if part else None)
    return out


def text_chart(
    values: Sequence[float | None],
    *,
    width: int = 60,
    height: int = 8,
    low: float = 0.0,
    high: float = 1.0,
    title: str = "training reward",
) -> list[str]:
    """Lines of a column chart of ``values`` (binned to ``width``) between ``low`` and
    ``high``, with the axis labelled; empty when there is nothing to draw."""
    columns = binned(values, width)
    if not columns:
        return []
    span = (high - low) or 1.0
    levels = [
        None if v is None else min(max((v - low) / span, 0.0), 1.0) * height * 8 for v in columns
    ]
    lines = [f"{title} (steps 1-{len(values)}, {len(columns)} bins)"]
    for row in range(height, 0, -1):
        cells: list[str] = []
        for level in levels:
            if level is None:
                cells.append(" ")
                continue
            fill = level - (row - 1) * 8
            cells.append(_BLOCKS[int(min(max(fill, 0), 8))])
        label = f"{low + span * row / height:4.2f}" if row in (height, height // 2) else "    "
        lines.append(f"{label} │{''.join(cells)}")
    lines.append(f"{low:4.2f} └{'─' * len(columns)}")
    return lines


def save_png(
    path: Path,
    rewards: Sequence[float | None],
    validations: Sequence[EvalSummary] = (),
    *,
    title: str = "GRPO training reward",
) -> bool:
    """Write the curve to ``path``; ``False`` when matplotlib is not installed."""
    if importlib.util.find_spec("matplotlib") is None:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [i + 1 for i, v in enumerate(rewards) if v is not None]
    values = [v for v in rewards if v is not None]
    figure, axes = plt.subplots(figsize=(8, 4.5))
    axes.plot(steps, values, color="#9ab", linewidth=0.8, label="per step")
    window = max(1, len(values) // 20)
    smooth = [
        sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
        for i in range(len(values))
    ]
    axes.plot(steps, smooth, color="#1f5fbf", linewidth=2, label=f"mean of {window} steps")
    points = [(v.step, v.mean_reward) for v in validations if v.mean_reward is not None]
    if points:
        axes.plot(*zip(*points, strict=True), "o-", color="#d2691e", label="validation")
    axes.set_xlabel("step")
    axes.set_ylabel("reward")
    axes.set_ylim(-0.02, 1.02)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True
