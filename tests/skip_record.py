"""A pytest plugin for scripts/test.sh: appends the node id of every skipped test to the file that
FLAGSEARCH_SKIP_RECORD names, so that the script can compare the suite's skips with
tests/allowed_skips.txt (scripts/check_skips.py). Under pytest-xdist the controller sees every report."""

from __future__ import annotations

import os

import pytest


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get("FLAGSEARCH_SKIP_RECORD")
    if path and report.skipped and not hasattr(report, "wasxfail"):
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(report.nodeid + "\n")
