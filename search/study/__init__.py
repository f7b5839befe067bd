"""The trial loop and what a trial resolves before it starts (inputs, fit, preflight, cost, dry run), the
study's noise probes, and one fresh start measured (shared with the confirmation)."""

__all__ = [
    "curves", "dryrun", "estimate", "fresh_start", "inputs", "lock", "memory_fit", "noise", "preflight",
    "recovery", "scoring", "study", "unified_memory",
]
