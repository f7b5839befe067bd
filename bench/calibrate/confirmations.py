"""The paired noise of real confirmations (`search run`'s last step): each confirmation stores, per arm,
one list of run values per fresh start, in rounds. Within-round log differences against the default
are the paired test's unit; their spread around their mean is the noise the gate saw. Printed per
comparison and pooled, with and without the single largest residual (one slow start is enough to
hide a 10% control in 4 rounds), so that `simulate` can be fed either."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np


def load(path: Path) -> list[dict[str, Any]]:
    """Confirmations in a file: one confirmation object, {"confirmations": [...]}, or demo runs
    ({"demos": [{"confirmation": ...}, ...]}, as bench/data/demo_confirmations_*.json)."""
    data = json.loads(path.read_text())
    if "demos" in data:
        return [d["confirmation"] for d in data["demos"] if d.get("confirmation")]
    found: list[dict[str, Any]] = data.get("confirmations", [data])
    return found


def _start_logs(arm: dict[str, Any]) -> list[float]:
    return [math.log(float(np.mean(runs))) for runs in arm["runs"] if runs]


def differences(confirmation: dict[str, Any], drop_round: int | None = None) -> dict[str, list[float]]:
    """Per compared arm: the within-round log differences (arm - default), without round
    `drop_round` (a slow start of the default is in every comparison of its round)."""
    default, *others = confirmation["arms"]
    base = _start_logs(default)
    return {arm["label"]: [b - a for i, (a, b) in enumerate(zip(base, _start_logs(arm), strict=False))
                           if i != drop_round] for arm in others}


def centered(d: list[float]) -> list[float]:
    """Paired differences minus their mean (none for fewer than two: no spread to estimate)."""
    return [x - float(np.mean(d)) for x in d] if len(d) > 1 else []


def residuals(confirmation: dict[str, Any], drop_round: int | None = None) -> dict[str, list[float]]:
    """`differences` minus their mean (none where fewer than two rounds are left)."""
    return {label: centered(d) for label, d in differences(confirmation, drop_round).items()}


def pooled_sd(groups: list[list[float]]) -> tuple[float, int]:
    """Pooled sd of groups of mean-centred residuals (each group loses one degree of freedom)."""
    ss = sum(x * x for g in groups for x in g)
    df = sum(len(g) - 1 for g in groups if len(g) > 1)
    return (math.sqrt(ss / df) if df else math.nan), df


def table(paths: list[Path]) -> str:
    lines = ["| confirmation | arm vs default | rounds | ratio (geo mean) | sd of paired difference "
             "| per start, each side |", "|---|---|---|---|---|---|"]
    confs = [(f"{path.stem}[{i}]", c) for path in paths for i, c in enumerate(load(path))]
    groups: list[list[float]] = []
    worst = (0.0, -1, -1)  # |residual|, confirmation, round
    for ci, (name, c) in enumerate(confs):
        for label, d in differences(c).items():
            r = centered(d)
            sd, _ = pooled_sd([r])
            groups.append(r)
            worst = max(worst, *((abs(x), ci, i) for i, x in enumerate(r)))
            lines.append(f"| {name} | {label} | {len(d)} | {math.exp(float(np.mean(d))):.3f} | "
                         f"{100 * sd:.1f}% | {100 * sd / math.sqrt(2):.1f}% |")
    sd, df = pooled_sd(groups)
    lines += ["", f"pooled: sd of the paired difference {100 * sd:.1f}% ({df} degrees of freedom), "
                  f"{100 * sd / math.sqrt(2):.1f}% per start and side"]
    if worst[1] >= 0:
        kept = [r for ci, (_, c) in enumerate(confs)
                for r in residuals(c, worst[2] if ci == worst[1] else None).values()]
        sd_t, df_t = pooled_sd(kept)
        lines.append(f"without round {worst[2] + 1} of {confs[worst[1]][0]} (largest residual "
                     f"{100 * worst[0]:.1f}%): {100 * sd_t:.1f}% ({df_t} degrees of freedom), "
                     f"{100 * sd_t / math.sqrt(2):.1f}% per start and side")
    return "\n".join(lines)
