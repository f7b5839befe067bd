"""What the bench tools share: a config of a space run through the product's door, and small
helpers for tables. Not an entry point."""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness import Measurement, MeasureSettings, QualityPlan, RunRequest, Session
from search.space.space import Config, Space

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "bench" / "data"


def request_for(space: Space, values: Mapping[str, Any], log_dir: Path, fresh: bool = True) -> RunRequest:
    """The RunRequest of one config of a single-engine, single-model space (values: its params)."""
    engine, model = next(iter(space.m.engines)), space.m.models[0].name
    return space.request(Config(engine=engine, model=model, values=dict(values)), log_dir, fresh=fresh)


def default_params(space: Space, leave_out: tuple[str, ...] = ()) -> dict[str, Any]:
    """The space's default config as params: without its engine and model, and without `leave_out`."""
    return {k: v for k, v in space.default_config().items() if k not in ("engine", "model", *leave_out)}


def measure_settings(space: Space) -> MeasureSettings:
    """The space's `measure:` section, as `search run` applies it."""
    m = space.m.measure
    return MeasureSettings(repeats=m.repeats, warmup=m.warmup, request_timeout_s=m.request_timeout_s,
                           policy=m.policy())


def run_config(session: Session, space: Space, values: Mapping[str, Any], log_dir: Path, fresh: bool = True,
               quality: QualityPlan | None = None) -> Measurement:
    """One config of the space through Session.run, at every load point of the space (the
    workloads named `<workload>@<param>=<value>` as search/study/curves.py reads them). Raises TrialFailed."""
    return session.run(request_for(space, values, log_dir, fresh), space.curve_specs(), measure_settings(space),
                       quality)


def loadavg() -> tuple[float, float]:
    one, five, _ = os.getloadavg()
    return round(one, 2), round(five, 2)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def typed_cell(value: str) -> Any:
    """A table cell as the param value it was: an int, a float, or the text."""
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value
