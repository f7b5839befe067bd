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

When a PR is named (`--pr N`, a `pr:N` build, or a recorded diff with `--pr-files`), its changed files
give prerequisites of their own: each engine module maps source paths to the kernel paths a change
there acts on (`Engine.source_paths`: vLLM's model_executor/layers/mamba/gdn/ -> the GDN kernel lines),
and the base run must name at least one of those selections, or the changed code never runs here.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

from harness import flagsearch_home
from harness.builds.routes import vllm_repo
from harness.engines import get_engine
from harness.engines.base import StartupInfo
from harness.session import LaunchFailed, MeasureSettings
from search.regress.ab import Subject, measure_alone
from search.regress.claims import Claim, hardware_gap, missing_prerequisites
from search.space.space import Space


def selected_paths(dialect: str, log_text: str) -> StartupInfo:
    """What the engine's log parser says this start selected (backends, kernels, facts)."""
    return get_engine(dialect).parse_startup(log_text)


def changed_files_from_text(text: str) -> list[str]:
    """The files a recorded diff changes (`diff --git a/X b/X`, `+++ b/X`), or a plain list, one a line."""
    found = (re.findall(r"^diff --git a/(\S+) b/", text, re.MULTILINE)
             or re.findall(r"^\+\+\+ b/(\S+)", text, re.MULTILINE))
    if found:
        return list(dict.fromkeys(found))
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def pr_changed_files(pr: int, progress: Callable[[str], None], repo: str | None = None) -> list[str]:
    """The files PR `pr` changes against the merge base with main, from the engine's git repository
    (FLAGSEARCH_VLLM_REPO, a fork or a mirror, or vLLM's). A blob-less clone under FLAGSEARCH_HOME/git
    keeps commits and trees only: the file list needs no file contents."""
    url = repo or vllm_repo()
    git_dir = flagsearch_home.home() / "git" / (re.sub(r"[^A-Za-z0-9_.-]", "_", url)[-80:] + ".git")
    if not git_dir.exists():
        subprocess.run(["git", "init", "-q", "--bare", str(git_dir)], check=True, capture_output=True)
    progress(f"reading PR #{pr}'s changed files from {url}")
    fetched = subprocess.run(["git", "-C", str(git_dir), "fetch", "-q", "--filter=blob:none", url,
                              f"+refs/pull/{pr}/head:refs/pr/{pr}", "+refs/heads/main:refs/heads/main"],
                             capture_output=True, text=True, timeout=1800)
    if fetched.returncode != 0:
        raise ValueError(f"PR #{pr}: git fetch from {url} failed ({fetched.stderr.strip()[-300:]}); give its changed "
                         "files with --pr-files FILE (a saved diff, or one path a line)")
    diff = subprocess.run(["git", "-C", str(git_dir), "diff", "--name-only", f"main...refs/pr/{pr}"],
                          capture_output=True, text=True, timeout=300, check=True)
    return [line for line in diff.stdout.splitlines() if line]


def pr_number(*specs: str | None) -> int | None:
    """The PR a build spec names (`pr:N`, `precompiled:pr:N@...`, an overlay of one), if any."""
    for spec in specs:
        found = re.search(r"(?:^|[\s:])pr:(\d+)", spec or "")
        if found:
            return int(found.group(1))
    return None


def path_prerequisites(dialect: str, changed: list[str], info: StartupInfo) -> tuple[list[str], list[str]]:
    """(what the base run shows of the paths the changed files act on, the changed files whose paths it
    does not show at all): a file whose every kernel path is missing from the base run's selections is
    code that does not run on this machine with this model."""
    engine = get_engine(dialect)
    shown: list[str] = []
    missing: list[str] = []
    for path in changed:
        keys = list(engine.paths_acted_on(path))
        if not keys:
            continue
        present = [f"{engine.kernel_paths.get(k, k)}: {info.backends[k]}" for k in dict.fromkeys(keys)
                   if k in info.backends]
        if present:
            shown += [p for p in present if p not in shown]
        else:
            labels = ", ".join(dict.fromkeys(engine.kernel_paths.get(k, k) for k in keys))
            missing.append(f"the change to {path} acts on the {labels}, which the base run's log never names: "
                           "that code does not run here")
    return shown, missing


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
                              progress: Callable[[str], None], changed: list[str] | None = None) -> list[str]:
    """Sentences for every prerequisite the base run's log does not name (empty: all present): the
    claims' own words (`needs ...`) and, when a PR's changed files are known, the kernel paths they act
    on. Claims measured on other hardware are named before anything is built."""
    needing = [c for c in claims if c.needs]
    hardware = [c for c in claims if c.hardware]
    if not needing and not changed and not hardware:
        return []
    work.mkdir(parents=True, exist_ok=True)
    asked = [n for c in needing for n in c.needs] + ([f"the paths of {len(changed)} changed files"] if changed else [])
    progress("checking in a base run: " + ("; ".join(asked) if asked else "the hardware the claims name"))
    workloads = space.workload_specs(dict(base.request))[:1]
    try:
        side = measure_alone(base, workloads, MeasureSettings(repeats=1, warmup=False), 1, work, None, progress)
    except LaunchFailed as exc:
        return [f"the base run did not start ({exc.cause}), so its log cannot show the prerequisites"]
    text = "\n".join(Path(p).read_text(errors="replace") for p in side.log_paths)
    info = selected_paths(base.settings.dialect, text)
    progress(f"the base run selected: {describe_selection(info)}")
    gaps = hardware_notes(hardware, side.fingerprint)
    for gap in gaps:
        progress(gap)
    missing = [f"claim `{c.text}` needs `{need}`, but neither the base run's log ({work}) nor the paths its engine "
               f"selected ({describe_selection(info)}) name it: the change cannot act on this path on this machine, "
               "so building and measuring it here would not test the claim" + (f" ({'; '.join(gaps)})" if gaps else "")
               for c in needing for need in missing_prerequisites(c, text, info.backends)]
    if changed:
        shown, unshown = path_prerequisites(base.settings.dialect, changed, info)
        if shown:
            progress("the PR's code runs on this path in the base run: " + "; ".join(shown))
        missing += [f"{line} ({work})" + (f"; {'; '.join(gaps)}" if gaps else "") for line in unshown]
    return missing
