"""The statistics every verdict uses: paired and blocked sequential tests, their boundaries, the verdict type."""

__all__ = ["blocked", "boundaries", "gate", "paired_spread", "sequential"]
