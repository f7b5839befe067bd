"""The gate on simulated noise: runs drawn from given noise components (log-normal start effect +
run noise) through the product's sequential gate, and error counts through its error-rate verdict.
Labelled as simulations wherever they are printed."""

from __future__ import annotations

import numpy as np

from bench.calibrate.gate import sequential
from search.verdicts.sequential import compare_errors


def draw_side(rng: np.random.Generator, level: float, starts: int, runs: int, sd_between: float,
              sd_within: float) -> list[list[float]]:
    return [list(level * np.exp(rng.normal(0, sd_between) + rng.normal(0, sd_within, runs))) for _ in range(starts)]


def plan_text(looks_at: tuple[int, ...], cap: int) -> str:
    return f"3..{cap}" if not looks_at else ",".join(str(n) for n in sorted({*looks_at, cap}) if n <= cap)


def simulate(sd_between: float, sd_within: float, runs: list[int], caps: list[int], effects: list[float],
             trials: int, seed: int = 1, plans: tuple[tuple[int, ...], ...] = ((),), boundary: str = "pocock") -> str:
    """`plans`: the rounds the gate looks after; () is every round from the third. `boundary`: the looks'
    thresholds (search ab --boundary)."""
    lines = [f"simulated: start effect sd {100 * sd_between:.1f}%, run-to-run sd {100 * sd_within:.1f}% (log-normal), "
             f"{trials} sequential runs per cell; alpha 0.02, min effect 3%, {boundary} boundary", "",
             "| runs/start | cap | looks | change | regressed | unchanged | inconclusive | mean starts/side |",
             "|---|---|---|---|---|---|---|---|"]
    rng = np.random.default_rng(seed)
    for r in runs:
        for cap in caps:
            for looks_at in plans:
                for effect in effects:
                    verdicts, used = [], []
                    for _ in range(trials):
                        a = draw_side(rng, 100.0, cap, r, sd_between, sd_within)
                        b = draw_side(rng, 100.0 * (1 - effect), cap, r, sd_between, sd_within)
                        o = sequential("single.output_tok_s", a, b, cap, looks_at, boundary)
                        verdicts.append(o.verdict)
                        used.append(o.rounds)
                    share = {k: 100 * verdicts.count(k) / trials for k in ("regressed", "unchanged", "inconclusive")}
                    change = f"{-100 * effect:+.0f}%" if effect else "0 (A/A)"
                    lines.append(f"| {r} | {cap} | {plan_text(looks_at, cap)} | {change} | {share['regressed']:.1f}% | "
                                 f"{share['unchanged']:.1f}% | {share['inconclusive']:.1f}% | {np.mean(used):.1f} |")
    return "\n".join(lines)


def simulate_errors(rates: list[float], requests: list[int], trials: int, seed: int = 2) -> str:
    """The error verdict under A/A (both sides fail at the same rate) and at 2x / 5x the rate on B."""
    rng = np.random.default_rng(seed)
    lines = [f"simulated error counts (binomial), {trials} comparisons per cell: share called regressed "
             "(and inconclusive)", "", "| error rate A | requests/side | B = A | B = 2x A | B = 5x A |",
             "|---|---|---|---|---|"]
    for rate in rates:
        for n in requests:
            cells = []
            for factor in (1, 2, 5):
                verdicts = [compare_errors("w.errors", int(rng.binomial(n, rate)), n,
                                           int(rng.binomial(n, min(1.0, rate * factor))), n).verdict
                            for _ in range(trials)]
                cells.append(f"{100 * verdicts.count('regressed') / trials:.1f}% "
                             f"({100 * verdicts.count('inconclusive') / trials:.0f}%)")
            lines.append(f"| {100 * rate:g}% | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
