"""One replayed flagsearch search, start by start: each start's config (its rank in the table, 0 = best) and
value (share of the best median), the stop rule's gain left and threshold, then the confirmation and the pick.

    nice -n 19 .venv/bin/python -m bench.experiments.stop_region.trace vllm table 22 42 46 49
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import bench.noisy_replay as nr
from bench.experiments.stop_region.sweep import TABLES
from bench.replay import load_table
from search.sampling import stopping
from search.sampling.stopping import nothing_left_to_win


def main() -> None:
    path = Path(TABLES[sys.argv[1]])
    level = sys.argv[2]
    table = load_table(path)
    table.judge(0.03)
    noise = nr.Noise(table, nr.measured_runs(path, table))

    def best_of(c: Any) -> float:
        curve = table.curve(c)
        return max(p.median for p in curve.values()) if curve else 0.0
    top = max(best_of(c) for c in table.configs)
    rank = {c: i for i, c in enumerate(sorted(table.configs, key=lambda c: -best_of(c)))}
    good = sorted(rank[c] for c in {c for c, _ in table.good})

    def label(params: dict[str, Any]) -> str:
        return f"r{rank[tuple(params[p] for p in table.params)]}"

    def should_stop(run: nr.Run) -> bool:
        d = nothing_left_to_win(run.observed, [run.params(i) for i in run.untried()], run.dists, nr.STATED_FLOOR,
                                min_results=len(run.dists) + 2)
        last = run.observed[-1]
        print(f"  start {run.starts:2d}: {label(last.params)} {(last.value or 0) / top:.3f}; gain left "
              f"{100 * (d.gain_left or 0):.2f}% vs {100 * stopping.STOP_SHARE * (d.detectable or 0):.2f}% "
              f"(noise {100 * (d.noise or 0):.1f}%), next {label(d.best_candidate) if d.best_candidate else '-'}"
              f"{'  STOP' if d.stop else ''}")
        return d.stop
    nr.Run.should_stop = should_stop  # type: ignore[method-assign,assignment]
    confirm = nr.Run.confirm_and_pick

    def confirm_and_pick(run: nr.Run) -> nr.Outcome:
        n = len(run.observed)
        out = confirm(run)
        print("  confirmation:", ", ".join(f"{label(o.params)} {(o.value or 0) / top:.3f}" for o in run.observed[n:]))
        return out
    nr.Run.confirm_and_pick = confirm_and_pick  # type: ignore[method-assign,assignment]
    print(f"{table.name}, noise {level}; best-equivalent: {', '.join(f'r{g}' for g in good)}")
    for s in (int(x) for x in sys.argv[3:]):
        print(f"seed {s}:")
        print("  ", nr.flagsearch(table, noise.draws(s, nr.level_sd(level, noise)), s))


if __name__ == "__main__":
    main()
