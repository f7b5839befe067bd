"""`search run --dry-run N`: the launches N sampled trials would make, starting nothing."""

from __future__ import annotations

import optuna

from harness.engines import get_engine
from search.memory_fit import estimate
from search.space import Space


def dry_run(space: Space, n: int) -> list[str]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=space.m.seed),
                                directions=[o.direction for o in space.m.objectives])
    study.enqueue_trial(space.default_config())
    lines: list[str] = []
    for i in range(n):
        trial = study.ask()
        config = space.sample(trial)
        settings = space.engine_settings(config.engine)
        flags, env, request = space.split(config)
        spec = get_engine(settings.dialect).build_launch(settings, space.model_choice(config.model), flags, env,
                                                         port=8000)
        label = "default" if i == 0 else f"sample {i}"
        lines.append(f"# trial {i} ({label}): {config.engine} / {config.model}"
                     + (f"; request-side: {request}" if request else ""))
        fit = estimate(space, config)
        if fit is not None and not fit.fits:
            lines.append(f"# not launched: cannot fit ({fit.detail})")
        elif fit is not None and fit.warning:
            lines.append(f"# warning: {fit.warning}")
        lines.append(spec.command_line())
        study.tell(trial, [0.0] * len(space.m.objectives))
    return lines
