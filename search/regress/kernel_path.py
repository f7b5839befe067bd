"""The kernel path of a start: the run-time selections its engine's startup log names (GDN prefill and
decode kernels, attention, MoE and quantized-GEMM backends, CUDA graph mode, ...), in the engine's own
words (`Engine.kernel_paths`), and what two starts selected alike and differently. It is what a "why"
compares: two builds always differ in version strings and free memory, and neither is a path."""

from __future__ import annotations

from typing import Any

from harness.engines import get_engine


def kernel_path(dialect: str, startup: dict[str, Any]) -> dict[str, str]:
    """{label: selection} of one start, in its engine's words (every backend it logged if the engine
    names no kernel paths of its own)."""
    try:
        engine = get_engine(dialect)
    except (KeyError, ValueError):
        return {k.replace("_", " "): str(v) for k, v in sorted((startup.get("backends") or {}).items())}
    return engine.kernel_path(startup)


def kernel_path_differences(dialect: str, a: dict[str, Any], b: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(what A and B selected differently, what they both selected), over the kernel path only: the
    engine's run-time selections (GDN, attention, MoE, quantized GEMM, CUDA graph mode, ...). A version
    string, free memory or a KV cache size is not a path, and is left to the report's log comparison."""
    pa, pb = kernel_path(dialect, a), kernel_path(dialect, b)
    differed = [f"{label}: {pa.get(label) or 'not named'} on A, {pb.get(label) or 'not named'} on B"
                for label in sorted(set(pa) | set(pb)) if pa.get(label) != pb.get(label)]
    same = [f"{label}: {value} on A and B" for label, value in pa.items() if pb.get(label) == value]
    return differed, same


def touched_labels(dialect: str, touched: dict[str, list[str]]) -> dict[str, str]:
    """{kernel path label: one changed file acting on it} for a PR's touched paths."""
    try:
        labels = get_engine(dialect).kernel_paths
    except (KeyError, ValueError):
        labels = {}
    return {labels.get(key, key.replace("_", " ")): files[0] for key, files in touched.items() if files}
