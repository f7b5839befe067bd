"""A claim's prerequisites, checked in the base run's log before anything is built.

A claim like '+24% tok/s on B200 needs FlashInfer CUTLASS MoE' relies on a code path. If the base
engine never selects that path on this machine (the backend is not there, the kernel does not exist
for this GPU), the change under test cannot take effect here, whatever it is; finding that out
after an hour-long source build is the waste this check avoids. One short start of the base (A)
side is enough: engines name their backend and kernel choices in the startup log, and the engine's
own log parser (harness/engines, StartupInfo.backends) reads them, so a prerequisite is found in a
log line or in a selected path ("FlashInfer CUTLASS MoE" in moe=FLASHINFER_CUTLASS). The check also
says plainly when the claim was measured on other hardware ("claimed on B200 (sm_100, 180 GB),
measured on NVIDIA GB10 (sm_121, ...)"): a kernel built for one architecture may not exist on another.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.engines import get_engine
from harness.engines.base import StartupInfo
from harness.session import LaunchFailed, MeasureSettings
from search.regress.ab import Subject, measure_alone
from search.regress.claims import Claim, hardware_gap, missing_prerequisites
from search.space.space import Space


def selected_paths(dialect: str, log_text: str) -> StartupInfo:
    """What the engine's log parser says this start selected (backends, kernels, facts)."""
    return get_engine(dialect).parse_startup(log_text)


def describe_selection(info: StartupInfo) -> str:
    picked = [f"{k}={v}" for k, v in sorted(info.backends.items())]
    return ", ".join(picked) if picked else "no backend or kernel line the parser knows"


def hardware_notes(claims: list[Claim], fingerprint: dict[str, object]) -> list[str]:
    """One sentence per claim measured on other hardware than this machine's."""
    notes = []
    for c in claims:
        gap = hardware_gap(c, fingerprint)
        if gap:
            notes.append(f"claim `{c.text}`: {gap}; a kernel or backend the claim relies on may not exist here")
    return notes


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
    info = selected_paths(base.settings.dialect, text)
    progress(f"the base run selected: {describe_selection(info)}")
    gaps = hardware_notes(needing, side.fingerprint)
    for gap in gaps:
        progress(gap)
    return [f"claim `{c.text}` needs `{need}`, but neither the base run's log ({work}) nor the paths its engine "
            f"selected ({describe_selection(info)}) name it: the change cannot act on this path on this machine, "
            "so building and measuring it here would not test the claim" + (f" ({'; '.join(gaps)})" if gaps else "")
            for c in needing for need in missing_prerequisites(c, text, info.backends)]
