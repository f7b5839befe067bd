"""The nightly's plan and its paperwork: pricing a plan against the job limit, the checks the job
promises before measuring (a CUDA torch in the candidate, a visible GPU), and promotion.

Pricing: per baseline, rounds x 2 sides x (start + measure), from the baseline's recorded start
times (startup.ready_s) and measure time (source.round_s, or a rough estimate from its e2e latency);
`rounds` is the cap the regress run may reach when the gate stays unsettled, so the plan is priced at
its worst case. With --workload only that workload's measure time counts. The candidate's build time
is the median of what finished builds of its kind recorded (`build_seconds` in their manifests under
FLAGSEARCH_HOME/builds), else --build-estimate-s; the plan says which.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.builds.builds import Build, pinned_text
from harness.builds.cache import READY, builds_dir
from search.regress.baseline import Baseline, kept, save_baseline
from search.store.results import read_json

# Seconds per round and side assumed for a baseline that records neither start nor measure time.
FALLBACK_START_S = 60.0


@dataclass
class Estimate:
    baseline: str
    start_s: float
    measure_s: float
    rounds: int
    how: str

    @property
    def total_s(self) -> float:
        return self.rounds * 2 * (self.start_s + self.measure_s)


def estimate(baseline: Baseline, rounds: int, keep_servers: bool = False, workload: str | None = None) -> Estimate:
    """Wall time of regressing one baseline, from what the baseline recorded. With `workload` (the
    nightly's --workload, which regress measures alone) only that workload's measure time counts."""
    starts = baseline.samples.get("startup.ready_s")
    start_s = _median(starts) if starts else float(baseline.startup.get("phases_s", {}).get("process_to_listening")
                                                   or FALLBACK_START_S)
    how = "start from startup.ready_s" if starts else "start from the startup phases (or a 60 s guess)"
    space = baseline.space()
    names = [w.name for w in space.m.workloads]
    if workload is not None and workload not in names:
        raise ValueError(f"--workload {workload!r}: not a workload of baseline {baseline.name} "
                         f"(its workloads: {', '.join(names)})")
    # One run per workload per repeat (plus a warmup run), each about one request's e2e time times
    # the requests per stream.
    reps = (space.m.measure.repeats or 1) + (1 if space.m.measure.warmup else 0)
    per_stream = {w.name.partition("@")[0]: w.requests_per_stream for w in space.workload_specs()}
    e2e = {name: _median(v) * per_stream.get(name, 1) for k, v in baseline.samples.items()
           if k.endswith(".e2e_p50_s") and v and (name := k.split(".", 1)[0].partition("@")[0]) in per_stream}
    if baseline.source.get("round_s"):
        measure_s = max(0.0, float(baseline.source["round_s"]) - start_s)
        how += ", measure from source.round_s"
        if workload is not None and len(names) > 1:
            # The recorded round measured every workload: this one's share of it, by its e2e time.
            whole = float(sum(e2e.values()))
            share = e2e[workload] / whole if workload in e2e and whole else 1 / len(names)
            measure_s *= share
            how += f" x {workload}'s share of it ({share:.0%}, {'by e2e_p50' if workload in e2e else 'even'})"
    else:
        chosen = [workload] if workload is not None else list(e2e)
        measure_s = reps * sum(e2e.get(name, 0.0) for name in chosen)
        how += ", measure ~ (repeats+warmup) x e2e_p50 x requests per stream (rough: the baseline records no round_s)"
        if workload is not None:
            how += f", {workload} only"
    if keep_servers:
        # One start per side for the whole run instead of one per round.
        return Estimate(baseline.name, start_s / rounds, measure_s, rounds, how + "; servers kept")
    return Estimate(baseline.name, start_s, measure_s, rounds, how)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


# Build kinds that create nothing (an interpreter or a command already on the machine).
_NOTHING_TO_BUILD = ("python", "command")


def recorded_build_seconds(kind: str) -> list[float]:
    """How long each finished build of this kind took, as its manifest in the build cache records it
    (`build_seconds`: pip builds' .flagsearch-build.json, overlay images' manifest.json)."""
    out = []
    for folder in sorted(builds_dir().glob("*")):
        for name in (READY, "manifest.json"):
            try:
                manifest = json.loads((folder / name).read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(manifest, dict):
                continue
            its_kind = "overlay" if manifest.get("overlay") else manifest.get("kind")
            seconds = manifest.get("build_seconds")
            if its_kind == kind and isinstance(seconds, (int, float)) and seconds > 0:
                out.append(float(seconds))
            break  # one manifest per folder
    return out


def build_time(kind: str, estimate_s: float) -> tuple[float, str]:
    """Seconds to allow for creating the candidate build, and where the figure comes from: the median
    of what finished builds of this kind recorded in the build cache (FLAGSEARCH_HOME/builds), else
    `estimate_s` (--build-estimate-s)."""
    if kind in _NOTHING_TO_BUILD:
        return 0.0, f"a {kind} build creates nothing"
    recorded = recorded_build_seconds(kind)
    if recorded:
        return _median(recorded), f"the median of {len(recorded)} {kind} build(s) in the build cache"
    if estimate_s:
        return estimate_s, f"--build-estimate-s: no {kind} build in the build cache records how long it took"
    return 0.0, f"none: no {kind} build in the build cache records how long it took, and no --build-estimate-s"


def refuse_plan(estimates: list[Estimate], limit_s: float, build_s: float, rounds: int) -> str | None:
    """A sentence saying what to change, or None when the plan fits in 90% of the job limit."""
    total = sum(e.total_s for e in estimates) + build_s
    budget = 0.9 * limit_s
    if total <= budget:
        return None
    per_round = sum(2 * (e.start_s + e.measure_s) for e in estimates)
    fit = int((budget - build_s) // per_round) if per_round else 0
    starts = sum(2 * e.rounds * e.start_s for e in estimates)
    heaviest = max(estimates, key=lambda e: e.total_s)
    hints = [f"--rounds {fit}" if fit >= 3 else "fewer baselines per job (--only NAME, one job each)",
             f"--keep-servers (saves about {starts / 60:.0f} min of starts, at the price of a session effect)",
             f"run `{heaviest.baseline}` ({heaviest.total_s / 60:.0f} min) in its own job (--only {heaviest.baseline})",
             "or raise the job limit (--job-limit-min, and the workflow's timeout-minutes)"]
    return (f"the plan needs about {total / 60:.0f} min ({len(estimates)} baseline(s) x {rounds} rounds x 2 sides"
            f"{f', plus {build_s / 60:.0f} min of build' if build_s else ''}), over 90% of the "
            f"{limit_s / 60:.0f} min job limit. Change one of: " + "; ".join(hints))


def _tool_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except OSError:
        return None


def chain_ratios(baseline: Baseline) -> dict[str, float]:
    """Per gated metric, the product of the B/A ratios of the promotions behind this baseline (1.0 for
    a baseline recorded directly): what search.regress.nightly.drifted multiplies tonight's ratio onto."""
    return {k: float(v) for k, v in (baseline.source.get("chain_ratio") or {}).items()
            if isinstance(v, (int, float)) and math.isfinite(v)}


def chain_variances(baseline: Baseline) -> dict[str, tuple[float, float]] | None:
    """Per gated metric, the promotions' log B/A ratios' summed variance and sum of variance^2 / df
    (search.regress.nightly.add_variance; drifted tests the chain's product with them); None for a chain
    promoted before variances were kept."""
    stored = baseline.source.get("chain_var")
    if stored is None:
        return {} if not baseline.source.get("chain_ratio") else None
    return {k: (float(v[0]), float(v[1])) for k, v in stored.items()
            if isinstance(v, list) and len(v) == 2 and all(math.isfinite(float(x)) for x in v)}


def promote(baseline: Baseline, report_dir: Path, build: Build, out_dir: Path, round_s: float) -> Path:
    """A baseline of the candidate's measurement, same name and gate, with where it came from and the
    promotion chain's product of B/A ratios and the sum of their variances (so that small losses cannot add
    up unseen, and the chain's own noise is not taken for one)."""
    from search.regress.nightly import add_variance, log_ratio_variance

    data = read_json(report_dir / "report.json")
    before = chain_ratios(baseline)
    gated = [v for v in data.get("verdicts") or []
             if v.get("gated") and isinstance(v.get("ratio"), (int, float)) and math.isfinite(v["ratio"])]
    chain = {v["metric"]: before.get(v["metric"], 1.0) * float(v["ratio"]) for v in gated}
    earlier = chain_variances(baseline)
    chain_var = None if earlier is None else {
        v["metric"]: list(add_variance(earlier.get(v["metric"]), night)) for v in gated
        if (night := log_ratio_variance(v)) is not None}
    side = (data.get("run") or {}).get("b") or {}
    ci_url = None
    if os.environ.get("GITHUB_RUN_ID"):
        ci_url = (f"{os.environ.get('GITHUB_SERVER_URL', '')}/{os.environ.get('GITHUB_REPOSITORY', '')}"
                  f"/actions/runs/{os.environ['GITHUB_RUN_ID']}")
    promoted = Baseline(
        name=baseline.name, config=baseline.config, params=baseline.params, samples=kept(side.get("samples") or {}),
        sample_unit="round", fingerprint=side.get("fingerprint") or {}, startup=side.get("startup") or {},
        quality=side.get("quality"), command=side.get("command", ""), gate=dict(baseline.gate),
        source={"kind": "nightly", "build": pinned_text(build), "build_resolved": build.fingerprint_fields(),
                "promoted_from": baseline.created, "previous_build": baseline.source.get("build"),
                "report": str(report_dir / "report.json"), "outcome": data.get("outcome"),
                "rounds": (data.get("run") or {}).get("rounds_done"), "round_s": round(round_s, 1),
                "chain_ratio": chain, "chain_var": chain_var,
                "chain_length": int(baseline.source.get("chain_length") or 0) + 1,
                "tool_commit": _tool_commit(), "ci_run": ci_url,
                "date": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()})
    return save_baseline(promoted, out_dir, overwrite=True)


# ---- what the job promises before it measures ------------------------------------------------------

_TORCH_PROBE = ("import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, "
                "'available': torch.cuda.is_available(), 'devices': torch.cuda.device_count()}))")


def torch_cuda_problem(python: str) -> str | None:
    """None when the environment's torch is a CUDA build that sees a GPU; else what is wrong, and why it
    happens (a wheel resolved against the default index brings the CPU torch)."""
    try:
        proc = subprocess.run([python, "-c", _TORCH_PROBE], capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {python}: {exc}"
    if proc.returncode != 0:
        tail = " ".join(proc.stderr.strip().splitlines()[-2:])
        return f"torch does not import in {python}: {tail}"
    info: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if not info.get("cuda"):
        return (f"the candidate's torch {info.get('torch')} is a CPU build (torch.version.cuda is None; {python}): "
                "its wheel resolved torch from the default index. Pin the CUDA torch with FLAGSEARCH_BUILD_BASE="
                "'torch==X+cuNNN' and its index (the workflow's TORCH_CUDA_VERSION and TORCH_CUDA_INDEX)")
    if not info.get("available") or not info.get("devices"):
        return (f"torch {info.get('torch')} (CUDA {info.get('cuda')}) sees no GPU (torch.cuda.is_available() is "
                "False): check the driver, CUDA_VISIBLE_DEVICES and the runner's access to /dev/nvidia*")
    return None


def gpu_problem(host: dict[str, Any]) -> str | None:
    """None when nvidia-smi lists a GPU on this host (harness.host.fingerprint); else the sentence to fail with."""
    if host.get("gpu_count"):
        return None
    return ("no GPU is visible on this runner (nvidia-smi is missing or lists none): a GPU nightly would "
            "measure nothing it was meant to; drop --require-gpu for a CPU runner")
