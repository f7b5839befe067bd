"""One exit-code table for every `search` command (docs/cli.md prints it; each `--help` ends with it).

A CI step reads the code alone, so one number means one thing in every command: "inconclusive" is 3
in `regress`, `ab`, `bisect` and `nightly` alike, and a usage error (argparse's own 2) is never a
measured answer.
"""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    PASS = 0  # done, nothing regressed (run/best/confirm: a feasible best config)
    REGRESSION = 1  # a regression, a contradicted claim or a flagged drift measured; run/best/confirm: none feasible
    USAGE = 2  # bad arguments; a space, baseline, study or history file missing, invalid or damaged
    INCONCLUSIVE = 3  # measured, but the evidence did not decide (the cap of rounds reached; an undecided claim)
    NOTHING_NEW = 4  # nightly: the candidate is the build already measured
    NO_CANDIDATE = 5  # nightly: the candidate build does not exist
    NO_HISTORY = 6  # history: no row yet for this baseline (a first night), not an error
    FAILED = 7  # an engine did not start, a build failed, the study storage failed: the machine, not the user
    INTERRUPTED = 130  # Ctrl-C (SIGINT): servers stopped, finished work stored
    TERMINATED = 143  # SIGTERM: the same


MEANING: dict[Exit, str] = {
    Exit.PASS: "pass (a feasible best config; no regression)",
    Exit.REGRESSION: "regression, contradicted claim or flagged drift (run, best, confirm: no feasible config)",
    Exit.USAGE: "usage or configuration error (bad arguments; a space, baseline, study or history file "
                "missing, invalid or damaged)",
    Exit.INCONCLUSIVE: "inconclusive (the measurements did not decide; an undecided claim)",
    Exit.NOTHING_NEW: "nothing new (nightly: the candidate is the build already measured)",
    Exit.NO_CANDIDATE: "no candidate (nightly: the build does not exist)",
    Exit.NO_HISTORY: "no history yet (history: nothing recorded for this baseline)",
    Exit.FAILED: "failed to measure (an engine did not start, a build or the study storage failed)",
    Exit.INTERRUPTED: "interrupted (SIGINT); finished work is stored",
    Exit.TERMINATED: "terminated (SIGTERM); finished work is stored",
}


def epilog() -> str:
    """The table as the last lines of every `--help` (argparse.RawDescriptionHelpFormatter keeps it)."""
    rows = "\n".join(f"  {int(code):>3}  {text}" for code, text in MEANING.items())
    return f"exit codes (the same in every command; docs/cli.md):\n{rows}"
