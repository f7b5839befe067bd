"""The suite summary counts which branch each statistical real-engine test took (tests/conftest.py):
a green run in which no detection ran says so."""

from __future__ import annotations

import pytest

pytest_plugins = ("pytester",)


def test_the_summary_counts_detected_and_fallback_branches(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("from tests.conftest import pytest_terminal_summary, record_branch  # noqa: F401\n")
    pytester.makepyfile(test_stat="""
        def test_found(record_branch):
            record_branch("detected", "regressed -10.2%")

        def test_noisy(record_branch):
            record_branch("fallback", "inconclusive, could detect 14.0% or more")
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*statistical real-engine tests: the branch each took*",
                                 "*test_stat.py::test_found: detected: regressed -10.2%",
                                 "*test_stat.py::test_noisy: fallback: inconclusive, could detect 14.0% or more",
                                 "detected 1, fallback 1 (of 2): the detection ran"])
    pytester.makepyfile(test_stat="""
        def test_noisy(record_branch):
            record_branch("fallback", "contended")
    """)
    pytester.runpytest("-p", "no:cacheprovider").stdout.fnmatch_lines(
        ["detected 0, fallback 1 (of 1): no detection ran in this suite"])
