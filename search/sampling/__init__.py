"""Choosing the next config: the design, the surrogate, TPE/NSGA-II samplers, pruning, the stop rule."""

__all__ = ["pruning", "sampler", "stopping", "surrogate", "warmstart"]
