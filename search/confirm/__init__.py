"""Confirmation: fresh-start rounds (search/study/fresh_start.py) of the top configs beside the default,
and the answer."""

__all__ = ["confirm"]
