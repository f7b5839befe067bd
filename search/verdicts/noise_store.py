"""Noise learnt across runs: the spread of a paired round's difference, per (host, engine, model, workload,
metric), kept under FLAGSEARCH_HOME/noise/ and borrowed by later comparisons of the same setup.

A paired comparison estimates the spread of its round differences from its own rounds: 2-9 degrees of freedom,
where the t quantile of a strict sequential threshold is several times the normal one. The same setup's noise was
measured in every earlier run; each run adds its residuals here (the round differences about their mean: their
sum of squares and degrees of freedom), and a comparison with at least MIN_DF stored degrees of freedom borrows
their pooled spread (`SpreadPrior`).

The guard. A stored spread is an earlier hour's; this hour may be noisier. So a comparison never takes a spread
below its own: where its own is the larger (a noisier hour), it is judged by its own spread at its own degrees
of freedom and the paired threshold, exactly as without a store; only where the stored spread is at least its
own does it use the stored one, at the stored degrees of freedom, against a threshold simulated for the whole
rule with this hour's noise drawn as the stored runs' own spread varied from run to run (`SpreadPrior.tau`:
the sd of their log variances beyond what their degrees of freedom explain). The chance of a false call is then
alpha over hours like the ones the store has seen, and a store whose runs disagree (a machine whose noise moves
with the hour) buys correspondingly little. An hour noisier than any stored one can still raise it (simulated,
looks at 3..10, alpha 0.02: 4.8% in an hour 1.3x noisier than the store, 6.5% at 2x): the nightly's A/A sentinel
is what keeps a store honest (`HourReading`: tonight's spread against the store's). No guard can do much better: one
sound for every hour cannot gain (with the hour's noise unrestricted the stored spread says nothing about it, and the
run's own t test is the best unbiased test); an F-guarded rule sound up to 1.3x noisier hours gains 4 points of power,
one sound to 1.5x loses (bench/experiments/noise_borrow/guard.py). So every paired run of `search ab` and `search
regress` adds its residuals, a study's stop rule prices its confirmation at them (search/study/study.py
`paired_noise`: planning needs no guard), but a comparison borrows only where BORROW_ENV is 1 (docs/calibration.md,
"Noise learnt across runs"). See
search/verdicts/sequential.py (`compare_paired(prior=...)`) and tests/search/test_noise_store.py.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from harness import flagsearch_home

BORROW_ENV = "FLAGSEARCH_BORROW_NOISE"  # "1": comparisons borrow the stored spread (recording is always on)
MIN_DF = 50  # stored degrees of freedom before a comparison borrows them (rounds of earlier runs, less one a run)
MIN_RUNS = 3  # runs whose spreads tell how much the hour moves it
BORROW_SIMS = 20_000
SECTION = "noise"


def store_dir() -> Path:
    return Path(os.environ.get("FLAGSEARCH_NOISE") or flagsearch_home.home() / SECTION)


def setup_key(host: str, engine: str, model: str, workload: str, metric: str) -> str:
    """The setup a spread belongs to, as a file name."""
    text = "|".join([host or "-", engine or "-", model or "-", workload or "-", metric])
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in text)[:200]


def key_for(fingerprint: Mapping[str, object], metric: str, kept: bool = False) -> str:
    """The setup of a metric measured on an engine with this fingerprint (host, engine, model_id): what a paired run
    (search/regress/ab.py) stores under and what a study's stop rule reads (search/study/study.py). Kept servers
    apart: their rounds hold no start-to-start spread."""
    workload, _, leaf = metric.partition(".")
    return setup_key(str(fingerprint.get("host", "")), str(fingerprint.get("engine", "")),
                     str(fingerprint.get("model_id", "")), workload + ("+kept" if kept else ""), leaf)


@dataclass(frozen=True)
class SpreadPrior:
    """The stored spread of a round's difference (log scale) with its degrees of freedom, and how much it moved
    between the stored runs (`tau`: sd of a run's log variance beyond its sampling spread)."""

    sd: float
    df: int
    runs: int
    tau: float

    def describe(self) -> str:
        return (f"{100 * self.sd:.2f}% from {self.runs} earlier runs ({self.df} df; it moves {100 * self.tau:.0f}% "
                "in variance from run to run)")


def add(key: str, diffs: Sequence[float], source: str = "", directory: Path | None = None) -> Path | None:
    """Store one run's residuals: the round differences (log) about their mean. None: fewer than 2 rounds."""
    d = np.asarray([x for x in diffs if math.isfinite(x)], dtype=float)
    if d.size < 2:
        return None
    path = (directory or store_dir()) / f"{key}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    row = {"ss": float(((d - d.mean()) ** 2).sum()), "df": int(d.size - 1), "source": source,
           "time": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()}
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.write(json.dumps(row) + "\n")
        fcntl.flock(fh, fcntl.LOCK_UN)
    return path


def runs(key: str, directory: Path | None = None) -> list[tuple[float, int]]:
    """(sum of squares, df) of every stored run of this setup; unreadable lines are skipped."""
    path = (directory or store_dir()) / f"{key}.jsonl"
    out: list[tuple[float, int]] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            ss, df = float(row["ss"]), int(row["df"])
        except (ValueError, KeyError, TypeError):
            continue
        if df > 0 and math.isfinite(ss) and ss >= 0:
            out.append((ss, df))
    return out


def prior_from(stored: Sequence[tuple[float, int]], min_df: int = MIN_DF) -> SpreadPrior | None:
    """The pooled spread of stored runs, with how much it moved between them; None below min_df or MIN_RUNS."""
    df = sum(d for _, d in stored)
    if df < min_df or len(stored) < MIN_RUNS:
        return None
    pooled = sum(ss for ss, _ in stored) / df
    if pooled <= 0:
        return None
    from scipy import special  # lazily: scipy costs every CLI start ~0.25 s

    # A run's log variance has sampling variance trigamma(df / 2) about the hour's (the log of a chi-square over
    # its df); what is left over is the hour's own.
    logs = np.array([math.log(max(ss / d, 1e-300) / pooled) for ss, d in stored])
    sampling = float(np.mean([special.polygamma(1, d / 2) for _, d in stored]))
    tau = math.sqrt(max(0.0, float(np.var(logs, ddof=1)) - sampling))
    return SpreadPrior(math.sqrt(pooled), df, len(stored), tau)


def prior(key: str, directory: Path | None = None) -> SpreadPrior | None:
    return prior_from(runs(key, directory))


@dataclass(frozen=True)
class HourReading:
    """One run's spread of round differences beside the store's pooled spread (the runs before it): what the
    nightly's A/A sentinel measures. `ratio` own / stored; `f_p` the one-sided F test's p of "this hour is
    noisier" (small: it was). Over nights the ratios say how far an hour strays from the store: a borrowing guard
    holds alpha only up to a stated ratio (bench/experiments/noise_borrow/guard.py)."""

    own_sd: float
    own_df: int
    stored_sd: float
    stored_df: int
    ratio: float
    f_p: float

    def describe(self) -> str:
        return (f"spread {100 * self.own_sd:.2f}% ({self.own_df} df), {self.ratio:.2f}x the store's "
                f"{100 * self.stored_sd:.2f}% ({self.stored_df} df; one-sided F p {self.f_p:.2g})")

    def to_dict(self) -> dict[str, float | int]:
        return {"own_sd": self.own_sd, "own_df": self.own_df, "stored_sd": self.stored_sd,
                "stored_df": self.stored_df, "ratio": self.ratio, "f_p": self.f_p}


def hour_reading(stored: Sequence[tuple[float, int]], diffs: Sequence[float]) -> HourReading | None:
    """This run's round differences (log) against the stored runs' pooled spread; the stored rows should not hold
    this run's own (`without`). None: fewer than 2 rounds, or nothing stored."""
    d = np.asarray([x for x in diffs if math.isfinite(x)], dtype=float)
    df0 = sum(df for _, df in stored)
    if d.size < 2 or df0 <= 0:
        return None
    from scipy import stats  # lazily: scipy costs every CLI start ~0.25 s

    own_var, stored_var = float(d.var(ddof=1)), sum(ss for ss, _ in stored) / df0
    if stored_var <= 0:
        return None
    f_p = float(stats.f.sf(own_var / stored_var, d.size - 1, df0))
    return HourReading(math.sqrt(own_var), int(d.size - 1), math.sqrt(stored_var), int(df0),
                       math.sqrt(own_var / stored_var), f_p)


def without(stored: Sequence[tuple[float, int]], diffs: Sequence[float]) -> list[tuple[float, int]]:
    """The stored rows less one row equal to this run's own (`add` stored it already), matched by value."""
    d = np.asarray([x for x in diffs if math.isfinite(x)], dtype=float)
    own = (float(((d - d.mean()) ** 2).sum()), int(d.size - 1)) if d.size >= 2 else None
    rows = list(stored)
    for i in range(len(rows) - 1, -1, -1):
        if own is not None and rows[i][1] == own[1] and math.isclose(rows[i][0], own[0], rel_tol=1e-9, abs_tol=1e-15):
            return rows[:i] + rows[i + 1:]
    return rows


def borrowing() -> bool:
    """Whether comparisons borrow stored spreads (BORROW_ENV)."""
    return os.environ.get(BORROW_ENV) == "1"


def _bucket(x: float, step: float) -> float:
    return round(round(x / step) * step, 6)


def borrowed_crossing(d: np.ndarray, looks: Sequence[int], s0: np.ndarray, df0: int, p_store: float,
                      p_own: float) -> np.ndarray:
    """Whether any look of the borrowing rule crosses, per sim (d: sims x rounds of round differences): where the
    stored spread s0 (per sim) is at least the run's own, the stored one at its df against `p_store`; where the
    run's own is larger (a noisier hour), its own at its own df against the paired threshold `p_own`, as bold as
    its own data allow and no bolder."""
    from scipy import special  # lazily: scipy costs every CLI start ~0.25 s
    hit = np.zeros(d.shape[0], dtype=bool)
    for n in looks:
        mean, own = d[:, :n].mean(axis=1), d[:, :n].std(axis=1, ddof=1)
        store = s0 >= own
        p_s = 2 * special.stdtr(df0, -np.abs(mean) / (s0 / math.sqrt(n)))
        p_o = 2 * special.stdtr(n - 1, -np.abs(mean) / (own / math.sqrt(n)))
        hit |= np.where(store, p_s < p_store, p_o < p_own)
    return hit


@lru_cache(maxsize=128)
def _borrowed_threshold(looks: tuple[int, ...], alpha: float, df0: int, tau: float) -> float:
    from search.verdicts.boundaries import paired_p_threshold

    rng = np.random.default_rng(19)
    # The store's spread is an estimate (df0 degrees of freedom) of its hours' typical one; this hour's is drawn
    # about it as the stored runs' spreads moved (log variance sd tau): the rule's false calls over such hours.
    s0 = np.sqrt(rng.chisquare(df0, BORROW_SIMS) / df0)
    hour = np.exp(tau / 2 * rng.standard_normal(BORROW_SIMS))
    d = hour[:, None] * rng.standard_normal((BORROW_SIMS, looks[-1]))
    p_own = paired_p_threshold(looks, alpha)
    lo, hi = 0.0, alpha
    for _ in range(24):  # the store branch's threshold whose rule crosses with chance alpha in all
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if borrowed_crossing(d, looks, s0, df0, mid, p_own).mean() <= alpha else (lo, mid)
    return lo


def borrowed_threshold(looks: Sequence[int], alpha: float, prior: SpreadPrior) -> float:
    """The p threshold of the borrowing rule's stored-spread branch for this plan (the own branch keeps the paired
    one): the chance of any false crossing is alpha over hours like the stored ones (simulated, seeded; the
    stored df and tau bucketed so that plans share it)."""
    plan = tuple(sorted(set(k for k in looks if k >= 2)))
    df0 = int(min(prior.df, 1000) // 10 * 10) or prior.df
    return _borrowed_threshold(plan, alpha, df0, _bucket(prior.tau, 0.05))
