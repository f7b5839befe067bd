"""The 2026-12-01 reorganisation of search/ and harness/ into sub-packages by concept: the rename map
and the script that applied it (git mv, then every module path, dotted or slashed, rewritten in code,
docs and configuration). Kept as the record of the moves; run once, from the repository root, on the
tree before them: `python docs/lab-notes/reorganise_2026_12_01.py`."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

# old module -> new module (dotted). Modules not named here stayed where they were.
MOVES: dict[str, str] = {
    # search/space: YAML -> validated Space
    "search.space": "search.space.space",
    "search.space_schema": "search.space.schema",
    "search.param_values": "search.space.values",
    # search/sampling: the design, the surrogate, the samplers, the stop rule
    "search.sampler": "search.sampling.sampler",
    "search.surrogate": "search.sampling.surrogate",
    "search.stopping": "search.sampling.stopping",
    "search.pruning": "search.sampling.pruning",
    "search.warmstart": "search.sampling.warmstart",
    "search.noise": "search.sampling.noise",
    # search/study: the trial loop and what each trial resolves before it starts
    "search.study": "search.study.study",
    "search.study_inputs": "search.study.inputs",
    "search.study_lock": "search.study.lock",
    "search.scoring": "search.study.scoring",
    "search.recovery": "search.study.recovery",
    "search.dryrun": "search.study.dryrun",
    "search.preflight": "search.study.preflight",
    "search.memory_fit": "search.study.memory_fit",
    "search.unified_memory": "search.study.unified_memory",
    "search.estimate": "search.study.estimate",
    "search.curves": "search.study.curves",
    # search/store: records on disk and in Optuna storage, the study read back
    "search.storage": "search.store.storage",
    "search.results": "search.store.results",
    "search.summary": "search.store.summary",
    "search.trial_index": "search.store.trial_index",
    # search/verdicts: the statistics
    "search.gate": "search.verdicts.gate",
    "search.sequential": "search.verdicts.sequential",
    "search.blocked": "search.verdicts.blocked",
    "search.boundaries": "search.verdicts.boundaries",
    "search.paired_spread": "search.verdicts.paired_spread",
    # search/confirm: fresh-start rounds beside the default
    "search.confirm": "search.confirm.confirm",
    "search.fresh_start": "search.confirm.fresh_start",
    # search/regress: sides, A/B, baselines, claims, explain, history, nightly
    "search.ab": "search.regress.ab",
    "search.baseline": "search.regress.baseline",
    "search.claims": "search.regress.claims",
    "search.explain": "search.regress.explain",
    "search.gate_report": "search.regress.gate_report",
    "search.history": "search.regress.history",
    "search.log_diff": "search.regress.log_diff",
    "search.nightly": "search.regress.nightly",
    "search.nightly_plan": "search.regress.nightly_plan",
    "search.prereq": "search.regress.prereq",
    # harness/measure: client, workloads, windows, steady state, metrics
    "harness.client": "harness.measure.client",
    "harness.measure": "harness.measure.measure",
    "harness.metrics": "harness.measure.metrics",
    "harness.metric_registry": "harness.measure.metric_registry",
    "harness.natural_end": "harness.measure.natural_end",
    "harness.steady": "harness.measure.steady",
    "harness.window": "harness.measure.window",
    "harness.workloads": "harness.measure.workloads",
    "harness.user_prompts": "harness.measure.user_prompts",
    "harness.stats": "harness.measure.stats",
    "harness.roofline": "harness.measure.roofline",
    "harness.capacity": "harness.measure.capacity",
    "harness.stability": "harness.measure.stability",
    "harness.external_bench": "harness.measure.external_bench",
    # harness/quality: checks, suites, reference answers
    "harness.quality": "harness.quality.quality",
    "harness.quality_checks": "harness.quality.checks",
    "harness.reference": "harness.quality.reference",
    "harness.logprobs": "harness.quality.logprobs",
    "harness.sandbox": "harness.quality.sandbox",
    # harness/builds: environments, images, routes, the build cache
    "harness.builds": "harness.builds.builds",
    "harness.build_cache": "harness.builds.cache",
    "harness.build_envs": "harness.builds.envs",
    "harness.build_images": "harness.builds.images",
    "harness.build_routes": "harness.builds.routes",
    # harness/host: what the measurement ran on, and who else used the host
    "harness.fingerprint": "harness.host.fingerprint",
    "harness.hostload": "harness.host.hostload",
    # harness/launch: the slowdown proxy is a way of running a server
    "harness.throttle": "harness.launch.throttle",
}

PACKAGES: dict[str, str] = {
    "search.space": "Space files: YAML -> validated Space (schema, param values, conditions, constraints).",
    "search.sampling": "Choosing the next config: the design, the surrogate, TPE/NSGA-II samplers, pruning, the stop rule.",
    "search.study": "The trial loop and what a trial resolves before it starts: inputs, fit, preflight, cost, dry run.",
    "search.store": "Records on disk and in Optuna storage, and the study read back from them.",
    "search.verdicts": "The statistics every verdict uses: paired and blocked sequential tests, their boundaries, the verdict type.",
    "search.confirm": "Confirmation: fresh-start rounds of the top configs beside the default, and the answer.",
    "search.regress": "Comparing builds and sides: A/B runs, baselines, claims, the why, history and the nightly.",
    "harness.measure": "Measuring a running server: client, workloads, steady windows, metrics, capacity, statistics.",
    "harness.quality": "Answer quality: spot-checks, suites, reference agreement, the code sandbox.",
    "harness.builds": "Engine builds: specs and routes, pip environments, images, the build cache.",
    "harness.host": "The host: the environment fingerprint and the load other programs put on it.",
}

TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".json", ".txt", ".cfg", ".ini", ""}


def dotted_to_path(dotted: str) -> str:
    return dotted.replace(".", "/") + ".py"


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def move_files() -> None:
    for package in PACKAGES:
        folder = Path(package.replace(".", "/"))
        folder.mkdir(parents=True, exist_ok=True)
    # search/space.py and search/study.py become packages of the same name: move them aside first
    for old, new in MOVES.items():
        old_path, new_path = Path(dotted_to_path(old)), Path(dotted_to_path(new))
        if old_path.with_suffix("") == new_path.parent:
            tmp = old_path.with_name(old_path.stem + "__moving.py")
            git("mv", str(old_path), str(tmp))
    for old, new in MOVES.items():
        old_path, new_path = Path(dotted_to_path(old)), Path(dotted_to_path(new))
        if not old_path.exists():
            old_path = old_path.with_name(old_path.stem + "__moving.py")
        new_path.parent.mkdir(parents=True, exist_ok=True)
        git("mv", str(old_path), str(new_path))
    for package, doc in PACKAGES.items():
        init = Path(package.replace(".", "/")) / "__init__.py"
        modules = sorted(p.stem for p in init.parent.glob("*.py") if p.stem != "__init__")
        names = ", ".join(f'"{m}"' for m in modules)
        init.write_text(f'"""{doc}"""\n\n__all__ = [{names}]\n')
        git("add", str(init))


DOTTED = re.compile(r"(?<![\w.])((?:search|harness)\.\w+)(?!\w)")
SLASHED = re.compile(r"(?<![\w/])((?:search|harness)/\w+)\.py\b")
FROM_PACKAGE = re.compile(r"^([ \t]*)from (search|harness) import ([\w ,]+)$", re.MULTILINE)


def rewrite(text: str, is_python: bool) -> str:
    """One pass each, so that a new name (search.space.space) is never rewritten again."""
    text = DOTTED.sub(lambda m: MOVES.get(m.group(1), m.group(1)), text)
    text = SLASHED.sub(lambda m: dotted_to_path(MOVES.get(m.group(1).replace("/", "."),
                                                          m.group(1).replace("/", "."))), text)
    if not is_python:
        return text

    def split_from(match: re.Match[str]) -> str:
        indent, package = match.group(1), match.group(2)
        kept, lines = [], []
        for name in (n.strip() for n in match.group(3).split(",")):
            base, _, alias = (part.strip() for part in name.partition(" as "))
            new = MOVES.get(f"{package}.{base}")
            if new is None:
                kept.append(name)
                continue
            new_pkg, new_mod = new.rsplit(".", 1)
            local = alias or base
            lines.append(f"{indent}from {new_pkg} import {new_mod}" + (f" as {local}" if local != new_mod else ""))
        if kept:
            lines.insert(0, f"{indent}from {package} import {', '.join(kept)}")
        return "\n".join(lines)

    return FROM_PACKAGE.sub(split_from, text)


def rewrite_tree() -> None:
    for name in git("ls-files").splitlines():
        path = Path(name)
        if path.suffix not in TEXT_SUFFIXES or not path.is_file() or name.startswith("docs/lab-notes/"):
            continue
        if name.startswith("bench/data/") or name.startswith("tests/data/"):
            continue
        text = path.read_text(encoding="utf-8")
        new = rewrite(text, path.suffix == ".py")
        if new != text:
            path.write_text(new, encoding="utf-8")


if __name__ == "__main__":
    move_files()
    rewrite_tree()
