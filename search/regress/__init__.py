"""Comparing builds and sides: A/B runs, baselines, claims, the why, history and the nightly."""

__all__ = [
    "ab", "baseline", "claims", "explain", "gate_report", "history", "kernel_path", "log_diff", "nightly",
    "nightly_plan", "prereq", "sides",
]
