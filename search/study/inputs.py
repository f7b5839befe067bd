"""What a study measures against, computed once and kept: the reference answers for agreement
checks, and the roofline of each (model, engine)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import optuna

from harness.measure.roofline import Roofline, build_roofline
from harness.quality.reference import ReferenceAnswers, ReferenceStore, reference_config, reference_key
from harness.session import Session
from search.space.space import Config, Space


class ReferenceCapture:
    """Reference answers: captured once per study on the reference config (the default config
    unless `quality.reference.params` says otherwise), kept in the results folder, then cached."""

    def __init__(self, space: Space, results_dir: Path, session: Session, phase: Callable[[str], None]):
        self.space, self.results_dir, self.session, self.phase = space, results_dir, session, phase
        self._answers: ReferenceAnswers | None = None

    def answers(self) -> ReferenceAnswers | None:
        spec = self.space.m.quality.reference
        if spec is None or self._answers is not None:
            return self._answers
        params = reference_config(self.space.default_config(), spec)
        config = self.space.sample(optuna.trial.FixedTrial(params))
        store = ReferenceStore(self.results_dir)
        answers = store.load(reference_key(config.model, params, spec))
        if answers is None:
            self.phase("capturing reference answers on the reference config (once per study)")
            answers = self.session.capture_reference(
                self.space.request(config, self.results_dir / "reference"),
                spec, config.model, params, self.space.m.measure.request_timeout_s)
            store.save(answers)
        self._answers = answers
        return answers


class Rooflines:
    """% of the memory-bandwidth ceiling, when the model's bytes per token are known: bandwidth as
    the space's `device` states it, else measured once per (model, engine) (GPU copy in the
    engine's torch, or host memory for CPU engines)."""

    def __init__(self, space: Space):
        self.space = space
        self._cache: dict[str, Roofline | None] = {}

    def of(self, config: Config) -> Roofline | None:
        key = f"{config.model}|{config.engine}"
        if key not in self._cache:
            device = self.space.m.device
            self._cache[key] = build_roofline(self.space.model_choice(config.model),
                                              device.bandwidth_gbs if device else None,
                                              engine_python=self.space.engine_settings(config.engine).python)
        return self._cache[key]
