"""What differs, and what is the same, between two sides' startups and environments, in plain sentences
for an A/B report: kernel and backend choices, facts read from the logs at run time, startup phases,
fingerprints."""

from __future__ import annotations

from harness.host.fingerprint import MATERIAL, material_differences
from search.regress.kernel_path import kernel_path_differences
from search.regress.sides import SideResult


def log_diff(a: SideResult, b: SideResult, allowed: tuple[str, ...] = ()) -> list[str]:
    """Plain sentences on what differs, and what is the same, between A's and B's startup and environment;
    `allowed`: fingerprint fields that differ by design (a side-by-side run's `cpus`), not named."""
    lines: list[str] = []
    sa, sb = a.startup or {}, b.startup or {}
    ba, bb = sa.get("backends") or {}, sb.get("backends") or {}
    differed, same = kernel_path_differences(a.dialect or b.dialect, sa, sb)
    lines += [f"kernel path {d}" for d in differed]
    if same:
        lines.append("same kernel path on A and B: " + "; ".join(s.removesuffix(" on A and B") for s in same))
    elif not ba and not bb:
        lines.append("neither log named a kernel or backend choice")
    fa, fb = sa.get("facts") or {}, sb.get("facts") or {}
    for k in sorted(set(fa) | set(fb)):
        if fa.get(k) != fb.get(k):
            lines.append(f"log fact `{k}`: A {fa.get(k)!r}, B {fb.get(k)!r}")
    for k in ("version", "kv_cache_tokens", "max_concurrency"):
        if sa.get(k) != sb.get(k):
            lines.append(f"{k}: A {sa.get(k)!r}, B {sb.get(k)!r}")
    pa, pb = sa.get("phases_s") or {}, sb.get("phases_s") or {}
    for k in sorted(set(pa) | set(pb)):
        va, vb = pa.get(k), pb.get(k)
        if va is None or vb is None:
            lines.append(f"startup phase `{k}` only in {'A' if vb is None else 'B'}")
        elif max(va, vb) > 1.0 and abs(va - vb) / max(va, vb) > 0.2:
            lines.append(f"startup phase `{k}`: A {va:.1f} s, B {vb:.1f} s")
    for d in material_differences(a.fingerprint, b.fingerprint, allowed):
        lines.append(f"fingerprint {d}")
    if a.fingerprint and b.fingerprint and not material_differences(a.fingerprint, b.fingerprint, allowed):
        lines.append("fingerprints agree on every material field (" + ", ".join(MATERIAL) + ")")
    return lines
