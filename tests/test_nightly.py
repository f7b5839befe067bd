"""`search nightly` before it measures anything: no matching baseline fails loudly, plans are priced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from search.baseline import load_baseline
from search.cli import main
from search.commands.nightly import estimate, refuse_plan

REPO = Path(__file__).resolve().parent.parent
COMMITTED = REPO / "baselines" / "smollm2-llamacpp-cpu-t1.json"


def copy_baseline(dest: Path, **fingerprint: object) -> Path:
    data = json.loads(COMMITTED.read_text())
    data["fingerprint"].update(fingerprint)
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / COMMITTED.name
    path.write_text(json.dumps(data))
    return path


def test_no_matching_baseline_is_a_failure_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy_baseline(tmp_path / "b", cpu_model="Some Other CPU", gpu_name="NVIDIA B200", gpu_count=8)
    argv = ["nightly", "--candidate-build", "command:/bin/true", "--baselines", str(tmp_path / "b"),
            "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "FAILURE" in said and "no baseline" in said and "other hardware" in said and "--allow-no-baseline" in said
    assert main([*argv, "--allow-no-baseline"]) == 0
    assert "warning" in capsys.readouterr().err
    # An empty folder is the same failure.
    (tmp_path / "empty").mkdir()
    assert main(["nightly", "--candidate-build", "command:/bin/true", "--baselines", str(tmp_path / "empty")]) == 2


def test_a_plan_over_the_job_limit_is_refused_with_what_to_change(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from harness.fingerprint import host_fingerprint

    host = host_fingerprint()
    copy_baseline(tmp_path / "b", **{k: host.get(k) for k in ("cpu_model", "cpu_count", "gpu_name",
                                                                "gpu_compute_capability", "gpu_count")})
    code = main(["nightly", "--candidate-build", "command:/definitely/not/built", "--baselines",
                 str(tmp_path / "b"), "--rounds", "40", "--job-limit-min", "30", "--out", str(tmp_path / "r")])
    said = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "refused" in said and "job limit" in said and "--rounds" in said, said
    assert not (tmp_path / "r").exists()  # nothing was built or measured


def test_estimate_uses_recorded_start_and_measure_times() -> None:
    b = load_baseline(COMMITTED)
    e = estimate(b, rounds=6)
    assert e.start_s == pytest.approx(3.159, abs=0.01)  # median of startup.ready_s
    assert e.measure_s > 0 and e.total_s == pytest.approx(12 * (e.start_s + e.measure_s))
    b.source["round_s"] = 30.0
    assert estimate(b, rounds=6).measure_s == pytest.approx(30.0 - e.start_s)
    # 122B-like: 30 min starts x 6 rounds x 2 sides do not fit a 6-hour job; 2 rounds do.
    del b.source["round_s"]
    b.samples["startup.ready_s"] = [1790.0, 1800.0, 1810.0]
    big = estimate(b, rounds=6)
    why = refuse_plan([big], 360 * 60, 0.0, 6)
    assert why is not None and "--rounds" in why and "--keep-servers" in why
    assert refuse_plan([estimate(b, rounds=2)], 360 * 60, 0.0, 2) is None
