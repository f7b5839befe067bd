"""A claim's prerequisites, checked in the base run's log before anything is built.

A claim like '+24% tok/s on B200 needs FlashInfer CUTLASS MoE' relies on a code path. If the base
engine never selects that path on this machine (the backend is not there, the kernel does not exist
for this GPU), the change under test cannot take effect here, whatever it is; finding that out
after an hour-long source build is the waste this check avoids. One short start of the base (A)
side is enough: engines name their backend and kernel choices in the startup log.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.session import LaunchFailed, MeasureSettings
from search.ab import Subject, measure_alone
from search.claims import Claim, missing_prerequisites
from search.space import Space


def check_claim_prerequisites(claims: list[Claim], base: Subject, space: Space, work: Path,
                              progress: Callable[[str], None]) -> list[str]:
    """Sentences for every prerequisite the base run's log does not name (empty: all present)."""
    needing = [c for c in claims if c.needs]
    if not needing:
        return []
    work.mkdir(parents=True, exist_ok=True)
    progress(f"checking claim prerequisites in a base run: {'; '.join(n for c in needing for n in c.needs)}")
    workloads = space.workload_specs(dict(base.request))[:1]
    try:
        side = measure_alone(base, workloads, MeasureSettings(repeats=1, warmup=False), 1, work, None, progress)
    except LaunchFailed as exc:
        return [f"the base run did not start ({exc.cause}), so its log cannot show the prerequisites"]
    text = "\n".join(Path(p).read_text(errors="replace") for p in side.log_paths)
    return [f"claim `{c.text}` needs `{need}`, but the base run's log ({work}) never names it: the change "
            "cannot act on this path on this machine, so building and measuring it here would not test the claim"
            for c in needing for need in missing_prerequisites(c, text)]
