"""scripts/test.sh fails when the suite's skipped tests differ from tests/allowed_skips.txt: the record
(tests/skip_record.py, under pytest-xdist too) and the comparison (scripts/check_skips.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import check_skips  # noqa: E402

SAMPLE = '''
import pytest

def test_runs():
    pass

@pytest.mark.skipif(True, reason="not here")
def test_marked():
    pass

def test_skips_inside():
    pytest.skip("no source")

@pytest.mark.xfail(reason="known")
def test_expected_failure():
    assert False
'''


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["plain", "xdist"])
def test_the_record_names_every_skipped_test(tmp_path: Path, workers: list[str]) -> None:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    record = tmp_path / "skipped.txt"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.skip_record",
                           *workers, str(tmp_path / "test_sample.py")], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "FLAGSEARCH_SKIP_RECORD": str(record)}, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {line.split("::")[-1] for line in record.read_text().split()} == {"test_marked", "test_skips_inside"}


def test_a_new_skip_or_a_listed_test_that_ran_fails(tmp_path: Path) -> None:
    allowed = check_skips.read_ids(check_skips.ALLOWED)
    assert allowed and all("::" in node for node in allowed)  # the documented list parses
    assert check_skips.differences(set(allowed), allowed, subset=False) == []
    extra = check_skips.differences({*allowed, "tests/x.py::test_new"}, allowed, subset=False)
    assert extra == ["skipped, but not in allowed_skips.txt: tests/x.py::test_new"]
    ran = check_skips.differences(set(), allowed, subset=False)
    assert len(ran) == len(allowed) and all("but ran" in line for line in ran)
    assert check_skips.differences(set(), allowed, subset=True) == []  # part of the suite: fewer skips are fine
    record = tmp_path / "r.txt"
    record.write_text("tests/x.py::test_new\n")
    assert check_skips.main([str(record)]) == 1 and check_skips.main([str(record), "--subset"]) == 1
