"""Values of a space's params: Optuna distributions, defaults, rounding of sampled floats and the
finite value sets of request-side params (the load ladder)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import optuna

from search.space.schema import BoolParam, CategoricalParam, FixedParam, FloatParam, IntParam, SpaceError


def distribution(param: Any) -> optuna.distributions.BaseDistribution | None:
    if isinstance(param, CategoricalParam):
        return optuna.distributions.CategoricalDistribution(param.choices)
    if isinstance(param, BoolParam):
        return optuna.distributions.CategoricalDistribution([False, True])
    if isinstance(param, IntParam):
        return optuna.distributions.IntDistribution(param.low, param.high, log=param.log, step=param.step)
    if isinstance(param, FloatParam):
        return optuna.distributions.FloatDistribution(param.low, param.high, log=param.log, step=param.step)
    return None  # fixed


def default_value(param: Any) -> Any:
    if isinstance(param, FixedParam):
        return param.value
    if isinstance(param, CategoricalParam):
        return param.default if "default" in param.model_fields_set else param.choices[0]
    if isinstance(param, BoolParam):
        return param.default
    return param.default if param.default is not None else param.low


def check_value(param: Any, value: Any) -> str | None:
    """Why `value` is not one the param can take (None: it can)."""
    if isinstance(param, FixedParam):
        return None if value == param.value else f"{value!r} differs from the fixed value {param.value!r}"
    if isinstance(param, CategoricalParam):
        return None if value in param.choices else f"{value!r} is not one of the choices {param.choices}"
    if isinstance(param, BoolParam):
        return None if isinstance(value, bool) else f"{value!r} is not true or false"
    if isinstance(param, IntParam):
        if isinstance(value, bool) or not isinstance(value, int) or not param.low <= value <= param.high:
            return f"{value!r} is not an integer in [{param.low}, {param.high}]"
        return None if (value - param.low) % param.step == 0 else f"{value} is off the step {param.step}"
    if isinstance(value, bool) or not isinstance(value, int | float) or not param.low <= value <= param.high:
        return f"{value!r} is not a number in [{param.low}, {param.high}]"
    return None


FLOAT_DIGITS = 4  # significant digits of a sampled float without a step


def _decimals(x: float) -> int:
    """Decimal places of a number as written: 0.05 -> 2, 1e-05 -> 5, 2.0 -> 0."""
    exponent = Decimal(repr(float(x))).normalize().as_tuple().exponent
    return max(0, -int(exponent))


def rounded_float(value: float, param: FloatParam) -> float:
    """A sampled float as the config, the launch command and every display carry it: on the param's
    step grid (counted from low, as Optuna counts it) with no binary residue, else FLOAT_DIGITS
    significant digits; clamped into [low, high]. (Optuna keeps its own unrounded copy for the
    sampler; the config is what runs and what is shown.)"""
    if param.step:
        steps = round((value - param.low) / param.step)
        out = round(param.low + steps * param.step, max(_decimals(param.step), _decimals(param.low)))
    else:
        out = float(f"{value:.{FLOAT_DIGITS}g}")
    return min(max(out, param.low), param.high)


def request_values(param: Any) -> list[Any]:
    """The values a request-side param takes on the load ladder (finite by validation)."""
    if isinstance(param, CategoricalParam):
        return list(param.choices)
    if isinstance(param, IntParam):
        return list(range(param.low, param.high + 1, param.step or 1))
    if isinstance(param, FixedParam):
        return [param.value]
    raise SpaceError(f"request-side parameter of type {type(param).__name__} has no finite set of values")

