"""Comparing builds and sides: the sides, A/B runs, baselines, claims, the why, kernel paths, bisection,
history and the nightly."""

__all__ = [
    "ab", "baseline", "bisect", "claims", "confounding", "explain", "gate_report", "history", "kernel_path",
    "log_diff", "nightly", "nightly_plan", "prereq", "sides",
]
