"""harness: everything that touches an engine, behind one door.

The public surface is `__all__`: a `Session` runs a config (`RunRequest`) through `Session.run`
(start or reuse its server, measure the workloads, check quality) and returns a `Measurement`, or
raises `TrialFailed` (`LaunchFailed` when the server never got ready) with a classified `Cause`.
`get_engine` / `DIALECTS` are the engine registry (one module per engine under harness/engines/).
Everything else in harness/ is an implementation detail of that door.

The names load on first use (PEP 562), so that a light module (harness.launch.throttle, run at every
start of a throttled server) does not pay for the HTTP client and the engines.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.engines import DIALECTS, EngineSettings, ModelChoice, get_engine
    from harness.failure import Cause, Failure, TrialFailed
    from harness.session import LaunchFailed, Measurement, MeasureSettings, QualityPlan, RunRequest, Session

_HOME = {
    "Session": "harness.session", "RunRequest": "harness.session", "Measurement": "harness.session",
    "MeasureSettings": "harness.session", "QualityPlan": "harness.session", "LaunchFailed": "harness.session",
    "TrialFailed": "harness.failure", "Failure": "harness.failure", "Cause": "harness.failure",
    "get_engine": "harness.engines", "DIALECTS": "harness.engines", "EngineSettings": "harness.engines",
    "ModelChoice": "harness.engines",
}

__all__ = ["DIALECTS", "Cause", "EngineSettings", "Failure", "LaunchFailed", "MeasureSettings", "Measurement",
           "ModelChoice", "QualityPlan", "RunRequest", "Session", "TrialFailed", "get_engine"]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
