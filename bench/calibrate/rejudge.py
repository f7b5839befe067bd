"""Stored confirmations judged again: each arm against the default as the stored verdict judged it (the
paired test until 2026-11-29, the arms' pooled noise until 2026-12-01) and by the test the confirmation
now uses (search/verdicts/blocked.py: each arm by its own within-round differences), on the same rounds,
plan of looks and level. Prints, per arm, both intervals and verdicts and the ratio of their widths (log
scale), then each confirmation's answer as stored and now."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

from bench.calibrate.confirmations import load
from search.confirm.confirm import Arm, confirmation_answer, judge
from search.verdicts.gate import MetricVerdict

LOOKS = re.compile(r"looks at (\d+)\.\.(\d+) rounds")


def plan(confirmation: dict[str, Any]) -> tuple[int, ...]:
    """The looks the stored verdicts were judged at (their note), else the rounds done alone."""
    for v in confirmation["verdicts"].values():
        if m := LOOKS.search(v.get("note", "")):
            return tuple(range(int(m.group(1)), int(m.group(2)) + 1))
    return (int(confirmation["rounds"]),)


def stored(confirmation: dict[str, Any]) -> dict[str, MetricVerdict]:
    """The verdicts as the confirmation stored them."""
    fields = {f.name for f in dataclasses.fields(MetricVerdict)}
    out = {}
    for key, v in confirmation["verdicts"].items():
        kept: dict[str, Any] = {k: (tuple(x) if k.startswith("samples_") else x) for k, x in v.items() if k in fields}
        out[key] = MetricVerdict(**kept)
    return out


def _width(v: MetricVerdict) -> float:
    return math.log(v.ci_high / v.ci_low) if v.ci_low > 0 else math.nan


def _ci(v: MetricVerdict) -> str:
    return f"{v.ratio:.2f}x ({v.ci_low:.2f}-{v.ci_high:.2f}) {v.verdict}"


def confirmations(paths: list[Path]) -> list[tuple[str, dict[str, Any]]]:
    """(name, confirmation) of every stored confirmation; of a demo file's demos, their earlier
    stages too (e.g. "M confirmation_stage1": the first 4 rounds a continuation extended)."""
    out = []
    for path in paths:
        data = json.loads(path.read_text())
        if "demos" not in data:
            out += [(f"{path.stem}[{i}]", c) for i, c in enumerate(load(path))]
            continue
        for demo in data["demos"]:
            out += [(f"{demo['demo']}" + ("" if key == "confirmation" else f" {key}"), c)
                    for key, c in demo.items() if isinstance(c, dict) and c.get("arms")]
    return out


def table(paths: list[Path]) -> str:
    lines = ["| confirmation | rounds (looks), the interval's level now | arm | as stored | judged now "
             "| width now / stored |",
             "|---|---|---|---|---|---|"]
    answers = []
    ratios = []
    for name, c in confirmations(paths):
        arms = [Arm(**a) for a in c["arms"]]
        if any(a.failures for a in arms) or len(arms) < 3:
            continue
        looks = plan(c)
        old, new = stored(c), judge(arms, c["metric"], c["direction"], 0.03, looks)
        level = f"{100 * next(iter(new.values())).level:.3g}%"
        labels = {a.key: a.label for a in arms}
        for key in (k for k in old if k in new):
            ratio = _width(new[key]) / _width(old[key])
            ratios.append(ratio)
            lines.append(f"| {name} | {c['rounds']} ({looks[0]}..{looks[-1]}), {level} | {labels[key]} | "
                         f"{_ci(old[key])} | {_ci(new[key])} | {ratio:.2f} |")
        answers.append(f"- {name}: as stored: {_head(confirmation_answer(arms, old, False, c['direction'])[0])}; "
                       f"now: {_head(confirmation_answer(arms, new, False, c['direction'])[0])}")
    mid = statistics.median(ratios) if ratios else math.nan
    return "\n".join([*lines, "", f"median width ratio {mid:.2f} over {len(ratios)} comparisons", "", *answers])


def _head(answer: str) -> str:
    """The answer's verdict, without its per-arm list."""
    return answer.split(";")[0].split(": #")[0] if not answer.startswith("confirmed") else answer.split(";")[0]
