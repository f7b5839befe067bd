"""The host: the environment fingerprint and the load other programs put on it."""

__all__ = ["fingerprint", "hostload"]
