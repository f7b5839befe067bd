"""Engine builds: specs and routes, pip environments, images, the build cache."""

__all__ = ["builds", "cache", "envs", "images", "routes"]
