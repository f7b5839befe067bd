"""What any paired test needs at a measured noise: the starts per side that detect a change with a given
power, for three tests from the most to the least favourable to the goal:

- a z test with the noise known in advance, one look at the end (no test that must estimate the noise
  or may stop early does better at the same false-alarm rate);
- a t test, one look at the end (the noise estimated from the rounds themselves);
- the gate's own plan: looks at every round from the third to N, with its Pocock threshold (the default) or
  the O'Brien-Fleming one (search.verdicts.sequential.rounds_needed, the number every report's "would settle"
  hint prints).

The noise is the paired residual per start (the spread of a start's value that its round does not share:
between starts and run to run, runs averaged in), as `bench.calibrate analyze` and the docs report it.
A round's difference has twice its variance (two independent starts). A slowdown e is the log change
-ln(1 - e), as the simulation draws it. Two-sided at alpha, as the gate is; by default the throughput verdict's
share of a run's budget (0.01: it shares 0.02 with the workload's error rate). Printed as a table; no
simulation, so it takes a second."""

from __future__ import annotations

import math
from dataclasses import dataclass

from search.verdicts.boundaries import MAX_PLANNED_ROUNDS
from search.verdicts.gate import DEFAULT_ALPHA
from search.verdicts.sequential import rounds_needed


@dataclass(frozen=True)
class Need:
    """Starts per side each test needs (None: more than the search allows), and the power at `cap`."""
    per_start: float
    z_starts: int
    t_starts: int | None
    gate_starts: int | None
    obf_starts: int | None
    z_power: float
    t_power: float


def round_sd(per_start: float) -> float:
    return math.sqrt(2.0) * per_start


def z_starts(per_start: float, effect: float, alpha: float, power: float) -> int:
    from scipy.stats import norm

    z = norm.ppf(1 - alpha / 2) + norm.ppf(power)
    return max(2, math.ceil((z * round_sd(per_start) / -math.log1p(-effect)) ** 2))


def t_power(per_start: float, effect: float, alpha: float, n: int) -> float:
    """Power of one two-sided t test on n round differences (df n - 1), the side of the change only."""
    from scipy.stats import nct, t

    shift = -math.log1p(-effect) / (round_sd(per_start) / math.sqrt(n))
    return float(nct.sf(t.ppf(1 - alpha / 2, n - 1), n - 1, shift))


def z_power(per_start: float, effect: float, alpha: float, n: int) -> float:
    from scipy.stats import norm

    shift = -math.log1p(-effect) / (round_sd(per_start) / math.sqrt(n))
    return float(norm.sf(norm.ppf(1 - alpha / 2) - shift))


def t_starts(per_start: float, effect: float, alpha: float, power: float, most: int = 200) -> int | None:
    return next((n for n in range(2, most + 1) if t_power(per_start, effect, alpha, n) >= power), None)


def need(per_start: float, effect: float, alpha: float, power: float, cap: int) -> Need:
    gate_effect = 1 / (1 - effect) - 1  # the gate's min_effect whose log is -ln(1 - effect)
    return Need(per_start, z_starts(per_start, effect, alpha, power), t_starts(per_start, effect, alpha, power),
                rounds_needed(round_sd(per_start), gate_effect, alpha, power),
                rounds_needed(round_sd(per_start), gate_effect, alpha, power, boundary="obrien-fleming"),
                z_power(per_start, effect, alpha, cap), t_power(per_start, effect, alpha, cap))


def largest_noise(starts: int, effect: float, alpha: float, power: float) -> float:
    """The largest per-start noise at which the known-noise z test needs at most `starts` starts per side."""
    from scipy.stats import norm

    z = norm.ppf(1 - alpha / 2) + norm.ppf(power)
    return -math.log1p(-effect) * math.sqrt(starts) / z / math.sqrt(2.0)


# The throughput verdict's share of a run's false-alarm budget in every live run: a family of two, the metric
# and its workload's error rate (search.regress.ab.family).
METRIC_ALPHA = DEFAULT_ALPHA / 2


def table(per_starts: list[float], effect: float = 0.05, cap: int = 10, alpha: float = METRIC_ALPHA,
          power: float = 0.95) -> str:
    def starts(n: int | None, most: int) -> str:
        return str(n) if n is not None else f"> {most}"

    lines = [f"starts per side to find -{100 * effect:g}% with {100 * power:g}% power, two-sided alpha {alpha:g} "
             f"(computed, not simulated; paired residual per start as measured)", "",
             f"| per start | z test, noise known, one look | t test, one look | the gate, looks 3..N: Pocock | "
             f"O'Brien-Fleming | "
             f"power at {cap} starts: z / t |", "|---|---|---|---|---|---|"]
    for s in per_starts:
        n = need(s, effect, alpha, power, cap)
        lines.append(f"| {100 * s:.2f}% | {n.z_starts} | {starts(n.t_starts, 200)} | "
                     f"{starts(n.gate_starts, MAX_PLANNED_ROUNDS)} | {starts(n.obf_starts, MAX_PLANNED_ROUNDS)} | "
                     f"{100 * n.z_power:.0f}% / {100 * n.t_power:.0f}% |")
    lines += ["", f"the largest per-start noise at which even the z test needs at most {cap} starts: "
                  f"{100 * largest_noise(cap, effect, alpha, power):.2f}%"]
    return "\n".join(lines)
