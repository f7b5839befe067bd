"""The trial loop and what a trial resolves before it starts: inputs, fit, preflight, cost, dry run."""

__all__ = [
    "curves", "dryrun", "estimate", "inputs", "lock", "memory_fit", "preflight", "recovery",
    "scoring", "study", "unified_memory",
]
