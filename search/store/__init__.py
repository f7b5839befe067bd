"""Records on disk and in Optuna storage, and the study read back from them."""

__all__ = ["results", "storage", "summary", "trial_index"]
