"""Engine dialects, one module each. A new engine is one module plus an entry here."""

from __future__ import annotations

import importlib

from harness.engines.base import (
    Engine,
    EngineSettings,
    FailureCause,
    FeatureExpectation,
    MetricNames,
    ModelChoice,
    StartupInfo,
)

_DIALECTS = {
    "vllm": ("harness.engines.vllm", "VllmEngine"),
    "llamacpp": ("harness.engines.llamacpp", "LlamaCppEngine"),
    "sglang": ("harness.engines.sglang", "SglangEngine"),
    "command": ("harness.engines.command", "CommandEngine"),
}

DIALECTS = tuple(_DIALECTS)


def get_engine(dialect: str) -> Engine:
    try:
        module_name, class_name = _DIALECTS[dialect]
    except KeyError:
        raise ValueError(f"unknown engine dialect {dialect!r} (known: {', '.join(_DIALECTS)})") from None
    return getattr(importlib.import_module(module_name), class_name)()


__all__ = ["DIALECTS", "Engine", "EngineSettings", "FailureCause", "FeatureExpectation", "MetricNames",
           "ModelChoice", "StartupInfo", "get_engine"]
