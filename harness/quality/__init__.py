"""Answer quality: spot-checks, suites, reference agreement, the code sandbox."""

__all__ = ["checks", "logprobs", "quality", "reference", "sandbox"]
