"""The dry run's time estimate learns from a real study: after one trial of a real llama-server, the
same space's --dry-run states the start and measuring times as measured, not assumed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parent.parent


@pytest.mark.e2e
def test_dry_run_estimate_uses_the_studys_measured_times(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "spaces" / "llamacpp-cpu.yaml").read_text())
    doc["params"] = {"threads": {"type": "categorical", "choices": [1], "default": 1}}
    doc["workloads"] = [{"name": "single", "streams": ["qa"], "max_tokens": 16}]
    doc["measure"] = {"repeats": 1, "warmup": False, "request_timeout_s": 60}
    doc["quality"] = {"suite": None}
    doc["objectives"] = [{"metric": "single.output_tok_s"}]
    doc["budget"] = {"trials": 1}
    doc.pop("confirm", None)
    space = tmp_path / "tiny.yaml"
    space.write_text(yaml.safe_dump(doc))
    results = tmp_path / "results"

    def search(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "search.cli", "run", str(space), "--results", str(results), *args],
                             capture_output=True, text=True, timeout=240, cwd=ROOT)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        return out.stdout

    before = search("--dry-run", "1")
    assert re.search(r"#   llamacpp: start \d+ s \((assumed|declared)\), measuring \d+ s \(\d+ passes", before), before
    search("--trials", "1", "--no-confirm")
    after = search("--dry-run", "1")
    line = next(ln for ln in after.splitlines() if ln.startswith("#   llamacpp: start"))
    assert re.search(r"start [\d.]+ s \(measured, 1 trials\), measuring \d+ s \(measured, 1 trials", line), line

