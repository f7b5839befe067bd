"""Measuring a running server: client, workloads, steady windows, metrics, capacity, statistics."""

__all__ = [
    "capacity", "client", "external_bench", "measure", "metric_registry", "metrics", "natural_end",
    "roofline", "sample", "stability", "stats", "steady", "user_prompts", "window", "workloads",
]
