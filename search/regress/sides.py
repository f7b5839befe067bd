"""The two sides of a comparison (`search regress`, `search ab`, `search bisect`): where each side's config
comes from (`resolve_source`), what each side runs (`Side`, its build spec: `side_spec`), the check before
anything is built (`plan_sides`), and what one side measured (`SideResult`)."""

from __future__ import annotations

import math
import shlex
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from harness.builds.builds import BuildSpec, dry_run_commands, parse_build
from harness.engines import EngineSettings
from search.exit_codes import Exit
from search.regress.baseline import (
    Baseline,
    baseline_from_study,
    config_params,
    load_baseline,
    pinned_space,
    raw_space_doc,
)
from search.regress.confounding import confounded, origin
from search.regress.nightly import refuse_kind
from search.space.space import Config, Space, load_space
from search.terminal import err


@dataclass
class Source:
    """A config to measure: where it came from, its one-point space and its pinned values."""

    label: str
    space: Space
    config: Config
    baseline: Baseline | None = None


def resolve_source(text: str, overrides: dict[str, Any]) -> Source:
    """A baseline JSON, a space YAML (its default config), or a study's results folder (its best trial,
    or FOLDER:N for trial N); `overrides` set parameters on top."""
    path, _, trial = text.partition(":") if not Path(text).exists() else (text, "", "")
    p = Path(path)
    if p.suffix == ".json" and p.is_file():
        baseline = load_baseline(p)
        params = {**baseline.params, **overrides}
        space, config = pinned_space(baseline.config, params, str(p))
        return Source(f"{baseline.name}", space, config, baseline)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        doc = raw_space_doc(p)
        params = config_params(load_space(p), overrides)
        space, config = pinned_space(doc, params, str(p))
        return Source(p.stem, space, config)
    if p.is_dir():
        b = baseline_from_study(p, "_", int(trial) if trial else None)
        params = {**b.params, **overrides}
        space, config = pinned_space(b.config, params, str(p))
        return Source(f"{p.name}#{b.source['trial']}", space, config)
    raise ValueError(f"{text!r}: not a baseline .json, a space .yaml or a study results folder")


@dataclass
class Side:
    """One side of a regress or ab run as planned: its build spec (None: the engine as configured)."""

    name: str  # "baseline", "candidate", "A", "B"
    owner: str  # the baseline's name or the config's label, for the messages
    settings: EngineSettings  # the engine the side's config runs
    spec: BuildSpec | None
    what: str = "baseline"  # "config" for ab's sides (search.regress.nightly.refuse_kind's hints)


def side_spec(build: str | None, python: str | None = None, image: str | None = None) -> BuildSpec | None:
    """What replaces a side's engine: its --*-build spec, else its --*-python or --*-image option."""
    if build:
        return parse_build(build)
    if python:
        return BuildSpec(kind="python", value=python)
    return BuildSpec(kind="image", value=image) if image else None


def plan_sides(sides: list[Side], dry_run: bool) -> int | None:
    """Before anything is built: refuse a side whose build cannot drive its engine (exit 2, pip against
    a Docker engine, an image against a process); with dry_run print each side's exact install, pull or
    build (refs resolved; nothing installed, pulled, built or measured) and return 0. None: go on."""
    refusals = [why for s in sides
                if s.spec and (why := refuse_kind(s.spec, s.settings, s.owner, f"{s.name} build", s.what))]
    for why in refusals:
        err.print(f"[red]refused[/]: {why}")
    if refusals:
        return Exit.USAGE
    if len(sides) == 2:
        warning = confounded(origin(sides[0].spec, sides[0].settings), origin(sides[1].spec, sides[1].settings))
        if warning:
            err.print(f"[yellow]warning[/]: {warning}")
            if dry_run:
                print(f"# {warning}")
    if not dry_run:
        return None
    for s in sides:
        if s.spec is None:
            engine = f"image {s.settings.image}" if s.settings.launcher == "docker" else shlex.join(s.settings.command)
            print(f"# {s.name}: nothing to build; runs the engine as configured ({engine})")
            continue
        print(f"# {s.name}: {s.spec.text()}")
        for line in dry_run_commands(s.spec):
            print(line)
    return 0


@dataclass
class SideResult:
    label: str
    command: str = ""
    dialect: str = ""  # the engine module that read its logs (names its kernel paths)
    samples: dict[str, list[float]] = field(default_factory=dict)  # metric -> one value per round
    runs: dict[str, list[list[float]]] = field(default_factory=dict)  # metric -> per start, every counted run
    startup: dict[str, Any] = field(default_factory=dict)  # StartupInfo of the first start
    fingerprint: dict[str, Any] = field(default_factory=dict)
    quality: dict[str, Any] | None = None  # the first start's quality result
    quality_starts: list[dict[str, Any]] = field(default_factory=list)  # every start's, up to QUALITY_STARTS
    warnings: list[str] = field(default_factory=list)
    placebo: list[str] = field(default_factory=list)
    log_paths: list[str] = field(default_factory=list)
    # workload -> each measured start's warm-up and length decisions (harness.measure.steady.SteadyState)
    steady: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # Set when the side did not start: side, round, command, cause, line (the deciding log line), log.
    failure: dict[str, Any] | None = None

    def add(self, metric: str, value: float | None) -> None:
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            self.samples.setdefault(metric, []).append(float(value))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SideResult:
        """A side as `to_dict` wrote it; fields a newer release added and this one lacks are left out."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
