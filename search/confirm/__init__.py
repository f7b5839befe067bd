"""Confirmation: fresh-start rounds of the top configs beside the default, and the answer."""

__all__ = ["confirm", "fresh_start"]
