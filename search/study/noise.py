"""A study's own noise floor: the default config re-measured with fresh starts during the study,
interleaved with the trials, so that the study knows its start-to-start spread on this machine,
today, and says when two configs differ by less than that.

The spread is the standard deviation of the log of the default's values (trial 0 and every probe):
a relative spread, comparable across metrics. Two configs whose ratio is within twice that are not
told apart by a single measurement each.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from harness.failure import TrialFailed
from harness.host.hostload import LoadMeter
from harness.session import Session
from search.sampling.sampler import NOISE_ATTR
from search.space.space import Space
from search.store.summary import StudyView
from search.study.fresh_start import measure_fresh


@dataclass(frozen=True)
class NoiseFloor:
    values: tuple[float, ...]  # the default's objective, one per fresh start
    spread: float  # sd of log values: ~ relative start-to-start spread

    @property
    def starts(self) -> int:
        return len(self.values)

    def describe(self) -> str:
        return (f"noise floor: the default varied {100 * self.spread:.1f}% between {self.starts} fresh starts; "
                f"configs within {200 * self.spread:.0f}% of each other are not told apart by one measurement")


def probe(session: Session, space: Space, study: optuna.Study, default_params: dict[str, Any], work_dir: Path,
          number: int) -> str:
    """Re-measure the default with a fresh start; store the value (and the host load) in the study."""
    meter = LoadMeter().start()
    try:
        values = measure_fresh(session, space, default_params, work_dir / f"probe-{number:02d}").values
    except TrialFailed as exc:
        return f"noise probe failed: {exc}"
    finally:
        session.close()
    window = meter.stop()
    value = math.exp(sum(math.log(v) for v in values) / len(values))
    probes = list(study.user_attrs.get(NOISE_ATTR, []))
    probes.append({"value": value, "runs": values, "at": time.time(), "load": window.to_dict()})
    study.set_user_attr(NOISE_ATTR, probes)
    return f"noise probe {len(probes)}: the default measured {value:.4g} on a fresh start"


def noise_floor(study: optuna.Study, baseline_value: float | None) -> NoiseFloor | None:
    """None until the default has at least two fresh-start values."""
    values = [p["value"] for p in study.user_attrs.get(NOISE_ATTR, []) if p.get("value")]
    if baseline_value:
        values = [baseline_value, *values]
    values = [v for v in values if v > 0]
    if len(values) < 2:
        return None
    logs = [math.log(v) for v in values]
    mean = sum(logs) / len(logs)
    spread = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    return NoiseFloor(tuple(values), spread)


def noise_line(view: StudyView) -> str | None:
    """The study's noise floor line, when the default was measured on two or more starts."""
    if view.study is None:
        return None
    base = view.baseline
    floor = noise_floor(view.study, base.objective_values[0] if base and base.objective_values else None)
    return floor.describe() if floor else None


def stop_rule_floor(study: optuna.Study, space: Space, baseline_value: float | None) -> float:
    """The spread the stop rule allows for: twice the study's measured start-to-start spread (two
    configs each measured once), or the space's stated floor until the default ran twice."""
    floor = noise_floor(study, baseline_value)
    stated = space.m.measure.noise_floor
    return max(stated, 2 * floor.spread) if floor else stated


def probe_due(space: Space, counted: int, counts_in_budget: bool) -> int | None:
    """The number of the probe due after a trial that brought the count to `counted`, if one is."""
    every = space.m.measure.noise_every
    return counted // every if every and counts_in_budget and counted % every == 0 else None
