"""Engine dialects, one module each: a module `harness/engines/<dialect>.py` that defines one Engine
subclass whose `dialect` is the module's name. A new engine is that module alone: it is found here
by its file name, with no list to edit."""

from __future__ import annotations

import importlib
import pkgutil

from harness.engines.base import (
    Engine,
    EngineSettings,
    FailureCause,
    FeatureExpectation,
    MetricNames,
    ModelChoice,
    StartupInfo,
)

_NOT_DIALECTS = frozenset({"base"})
DIALECTS = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__)
                        if not m.ispkg and not m.name.startswith("_") and m.name not in _NOT_DIALECTS))


def get_engine(dialect: str) -> Engine:
    if dialect not in DIALECTS:
        raise ValueError(f"unknown engine dialect {dialect!r} (known: {', '.join(DIALECTS)})")
    module = importlib.import_module(f"harness.engines.{dialect}")
    found = [obj for obj in vars(module).values()
             if isinstance(obj, type) and issubclass(obj, Engine) and getattr(obj, "dialect", None) == dialect]
    if len(found) != 1:
        raise ValueError(f"harness/engines/{dialect}.py must define one Engine subclass with dialect = {dialect!r}")
    return found[0]()


__all__ = ["DIALECTS", "Engine", "EngineSettings", "FailureCause", "FeatureExpectation", "MetricNames",
           "ModelChoice", "StartupInfo", "get_engine"]
