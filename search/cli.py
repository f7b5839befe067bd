"""`search`: the command line. Every subcommand is one module in search/commands/ with a
`register(subparsers)` function, discovered here; a new command is one new module."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import pkgutil
import signal
import sys

import optuna
import sqlalchemy.exc

from harness import secrets
from harness.launch.reaper import Terminated, install_signal_handlers, stop_all
from search import commands, exit_codes
from search.exit_codes import Exit
from search.space.space import SpaceError
from search.store.results import ResultsError
from search.store.storage import storage_for
from search.terminal import err, install_scrubbing_streams, safe
from search.terminal import out as console

# console/err (search.terminal): messages never folded, tables at the terminal's width or 160 columns
# when piped; user and engine text goes through safe() before it meets rich markup. storage_for is
# re-exported for commands that locate a study by name or folder.
__all__ = ["console", "err", "main", "storage_for"]


def version() -> str:
    """The installed distribution's version (what a bug report or a CI log needs)."""
    try:
        return importlib.metadata.version("flagsearch")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _with_exit_codes(parser: argparse.ArgumentParser) -> None:
    """Every command's --help, subcommands' included, ends with the one exit-code table."""
    parser.epilog = "\n\n".join(p for p in (parser.epilog, exit_codes.epilog()) if p)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _with_exit_codes(child)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="search", description="Find the fastest good config of an LLM server.")
    p.add_argument("--version", action="version", version=f"%(prog)s (flagsearch) {version()}")
    sub = p.add_subparsers(dest="cmd", required=True)
    first = ("run", "show")  # the everyday commands lead the help
    for module in sorted((m.name for m in pkgutil.iter_modules(commands.__path__)), key=lambda n: (n not in first, n)):
        importlib.import_module(f"search.commands.{module}").register(sub)
    _with_exit_codes(p)
    return p


def main(argv: list[str] | None = None) -> int:
    install_signal_handlers()
    # Ctrl-C/SIGINT stops every command cleanly (KeyboardInterrupt: servers stopped, the trial
    # recorded as interrupted), also when the tool was started with SIGINT ignored, as a background
    # job of a script is: Python installs its handler only where SIGINT was not ignored at start.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    install_scrubbing_streams()
    args = build_parser().parse_args(argv)
    if getattr(args, "storage", None):
        secrets.remember(secrets.url_secrets(args.storage))  # a database password in --storage
    try:
        return int(args.func(args))
    except (SpaceError, ResultsError, ValueError) as exc:
        err.print(f"[red]error[/]: {safe(' '.join(str(exc).split()))}")
        return Exit.USAGE
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError, ImportError) as exc:
        # A corrupted, full or unreachable study storage: the root cause, in one line.
        root: BaseException = exc
        while root.__cause__ is not None:
            root = root.__cause__
        reason = str(getattr(root, "orig", None) or root).strip().splitlines()[0]
        disk = " (disk full)" if "full" in reason.lower() else ""
        stop_all()
        err.print(f"[red]error[/]: the study storage failed{disk}: {safe(reason)}")
        # A URL that does not parse or names a driver not installed is the user's to fix.
        given = isinstance(exc, sqlalchemy.exc.ArgumentError | ImportError)
        return Exit.USAGE if given else Exit.FAILED
    except OSError as exc:  # a file or folder the OS refused (read-only, full, missing): one line naming it
        where = f"{exc.filename}: " if exc.filename else ""
        err.print(f"[red]error[/]: {safe(where)}{safe(exc.strerror or exc)}")
        return Exit.USAGE
    except Terminated:
        stop_all()
        err.print("[yellow]terminated[/]: servers stopped; finished trials are stored")
        return Exit.TERMINATED
    except KeyboardInterrupt:  # a command without its own Ctrl-C line: one line, never a traceback
        stop_all()
        err.print("[yellow]interrupted[/]: servers stopped; what finished is stored")
        return Exit.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
