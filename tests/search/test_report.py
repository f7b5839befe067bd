"""`search report`: tables, plots and the HTML page.

Unit tests check the builders on records made here (formatting, ratios, exports, escaping); the
e2e tests build a real study once per session by running `search run` on llama-server (the
default, other launch configs, a request-side change that reuses the server, and a config the
engine rejects) and check the report and the exported raw samples against it. llama-server is
ready in under a second, so the study takes a minute or two even on a busy machine.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import pytest

from harness import flagsearch_home
from harness.measure.client import RequestResult
from harness.measure.measure import WorkloadMeasurement
from harness.measure.sample import RunSample
from search.report import (
    MIN_IMPORTANCE_TRIALS,
    ReportInput,
    export_tables,
    find_results_dir,
    load_report_input,
    objective_plot_svg,
    param_importances,
    render_html,
    requests_frame,
    runs_frame,
    starts_summary,
    startup_plot_svg,
    trials_frame,
)
from search.store.results import Failure, ResultsError, TrialRecord
from search.store.summary import StudyView

# ---- records made here, for the builders ----------------------------------------------------------


def request(i: int, ok: bool = True) -> RequestResult:
    start = 100.0 + i
    if not ok:
        return RequestResult("w", False, 400, start, start + 0.1, error_kind="http_400",
                             error_body="too long")
    return RequestResult("w", True, 200, start, start + 2.0, ttft_s=0.5, chunk_gaps_s=[0.1] * 15,
                         output_tokens=16, prompt_tokens=40, finish_reason="length")


def workloads(n_requests: int, repeats: int = 2, failing: int = 0) -> dict[str, Any]:
    samples = []
    for rep in range(repeats):
        reqs = [request(i, ok=i >= failing) for i in range(n_requests)]
        samples.append(RunSample(rep, 2.5, reqs, {"generation_tokens": 16.0 * n_requests},
                                 {"output_tok_s": 12.0 + rep}, {"http_400": failing} if failing else {}))
    wm = WorkloadMeasurement("w", n_requests, samples, {})
    return {"w": wm.to_dict()}


def record(number: int, tok_s: float | None, ttft: float | None = None, state: str = "complete",
           constraints: list[float] | None = None, **kw: Any) -> TrialRecord:
    values = None if tok_s is None else ([tok_s] if ttft is None else [tok_s, ttft])
    defaults: dict[str, Any] = dict(
        number=number, state=state, params={"engine": "vllm", "model": "m", "max_num_seqs": 4 * (number + 1),
                                            "dtype": "bfloat16"},
        engine="vllm", model="m", command=f"python -m server --max-num-seqs {4 * (number + 1)}",
        ready_s=30.0 + number, startup={"ready_s": 30.0 + number, "phases_s": {"weight_loading": 1.5,
                                                                                "engine_init": 20.0}},
        metrics={"w.output_tok_s": tok_s or 0.0, "quality.score": 1.0, "errors": 0.0},
        objective_values=values, constraint_values=constraints or [0.0], log_path=f"/r/trials/{number:04d}/x",
        wall_s=60.0)
    defaults.update(kw)
    return TrialRecord(**defaults)


def single_view() -> StudyView:
    records = [
        record(0, 10.0),
        record(1, 15.0),
        record(2, 30.0, constraints=[1.0]),  # fastest, but violates a constraint
        record(3, None, state="failed", ready_s=None, startup={},
               failure=Failure("bad_flag", "unrecognized arguments: --nope",
                               ["INFO starting",
                                "error: unrecognized arguments: --nope <script>x</script>"])),
        record(4, 15.0, state="duplicate", duplicate_of=1, log_path=None, ready_s=None, startup={}),
        record(5, 20.0, reused_server=True, ready_s=0.0),
    ]
    return StudyView("unit", [("w.output_tok_s", "maximize")], records, baseline_number=0)


def test_trials_frame_ratios_feasibility_and_notes() -> None:
    df = trials_frame(single_view()).set_index("trial")
    assert list(df.index) == [0, 1, 2, 3, 4, 5]
    assert "param.engine" not in df.columns and "param.model" not in df.columns  # constant: not shown
    assert df.loc[1, "param.max_num_seqs"] == 8
    assert df.loc[1, "w.output_tok_s ×default"] == pytest.approx(1.5)
    assert df.loc[0, "w.output_tok_s ×default"] == pytest.approx(1.0)
    assert pd.isna(df.loc[3, "w.output_tok_s ×default"])
    assert bool(df.loc[1, "feasible"]) and not bool(df.loc[2, "feasible"]) and not bool(df.loc[3, "feasible"])
    assert "engine default" in df.loc[0, "note"]
    assert "constraint #1 violated" in df.loc[2, "note"]
    assert df.loc[3, "failure_cause"] == "bad_flag" and "unrecognized arguments" in df.loc[3, "note"]
    assert "same config as #1" in df.loc[4, "note"]


def test_starts_summary_counts_starts_reuse_and_duplicates() -> None:
    # trials 0, 1, 2, 3 launched a server; 5 reused one; 4 was not run (identical to 1)
    assert starts_summary(single_view()) == {"starts": 4, "reused": 1, "duplicates": 1}


def test_history_plot_single_objective() -> None:
    svg = objective_plot_svg(single_view())
    assert svg is not None and svg.startswith("<svg") and "<?xml" not in svg
    assert "best so far" in svg and "w.output_tok_s (higher is better)" in svg
    assert "failed (no measurement)" in svg and "infeasible (constraint violated)" in svg


def test_pareto_plot_two_objectives() -> None:
    records = [record(0, 10.0, 1.0), record(1, 20.0, 2.0), record(2, 15.0, 0.5), record(3, 12.0, 3.0)]
    view = StudyView("mo", [("w.output_tok_s", "maximize"), ("w.ttft_p50_s", "minimize")], records, 0)
    assert [r.number for r in view.best()] == [1, 2]  # #0 and #3 are dominated by #2
    svg = objective_plot_svg(view)
    assert svg is not None and "Pareto front (feasible)" in svg and "#1" in svg and "#2" in svg
    assert "w.ttft_p50_s (lower is better)" in svg


def test_pareto_plot_three_objectives_projects_the_first_two() -> None:
    records = [record(0, 10.0, 1.0), record(1, 20.0, 2.0)]
    for r in records:
        r.objective_values = [*(r.objective_values or []), float(r.number)]
    view = StudyView("mo3", [("a", "maximize"), ("b", "minimize"), ("c", "minimize")], records, 0)
    svg = objective_plot_svg(view)
    assert svg is not None and "front over all 3 objectives" in svg


def test_results_dir_found_from_the_server_logs(tmp_path: Path) -> None:
    """A study in a database (no folder given): the trials' logs say where their results are."""
    folder = tmp_path / "results" / "study"
    (folder / "trials" / "0000").mkdir(parents=True)
    view = StudyView("study", [("w.output_tok_s", "maximize")],
                     [record(0, 1.0, log_path=str(folder / "trials" / "0000" / "server.log"))], 0)
    assert find_results_dir("study", "study", view) == folder
    assert find_results_dir(str(tmp_path / "elsewhere"), "x", StudyView("x", [], [], None)) is None


def test_plots_absent_without_measurements() -> None:
    view = StudyView("empty", [("w.output_tok_s", "maximize")],
                     [record(0, None, state="failed", ready_s=None, startup={},
                             failure=Failure("timeout", "not ready after 300 s"))], None)
    assert objective_plot_svg(view) is None
    assert startup_plot_svg(view) is None
    page = render_html(ReportInput(view=view))
    assert "No feasible config" in page and "not ready after 300 s" in page


def test_startup_plot_names_phases_and_reuse() -> None:
    svg = startup_plot_svg(single_view())
    assert svg is not None
    assert "weight_loading" in svg and "engine_init" in svg and "reused" in svg


def test_importances_need_enough_trials() -> None:
    study = optuna.create_study(direction="maximize")
    study.optimize(lambda t: t.suggest_int("x", 0, 10) + 0.0 * t.suggest_float("noise", 0, 1),
                   n_trials=MIN_IMPORTANCE_TRIALS - 1)
    view = StudyView("s", [("v", "maximize")], [], None)
    imp = param_importances(study, view)
    assert imp.values == {} and imp.reason and "complete trial" in imp.reason


def test_importances_rank_the_parameter_that_matters() -> None:
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda t: 10.0 * t.suggest_int("x", 0, 10) + 0.01 * t.suggest_float("noise", 0, 1),
                   n_trials=20)
    imp = param_importances(study, StudyView("s", [("v", "maximize")], [], None))
    assert imp.reason is None
    assert imp.values["v"]["x"] > 0.8 > imp.values["v"]["noise"]


def unit_input(tmp_path: Path) -> ReportInput:
    view = single_view()
    results = {0: {**view.records[0].summary(), "workloads": workloads(2)},
               1: {**view.records[1].summary(), "workloads": workloads(3, failing=1)},
               3: {**view.records[3].summary(), "workloads": {}}}
    return ReportInput(view=view, storage="sqlite:///x.db", results_dir=tmp_path, results=results)


def test_requests_frame_one_row_per_request() -> None:
    df = requests_frame(unit_input(Path("/nowhere")))
    assert len(df) == 2 * 2 + 3 * 2  # trial 0: 2 requests x 2 repeats; trial 1: 3 x 2; trial 3 failed: none
    assert set(df["trial"]) == {0, 1}
    ok = df[df["ok"]]
    assert (ok["tpot_s"] - (2.0 - 0.5) / 15).abs().max() < 1e-9
    bad = df[~df["ok"]]
    assert len(bad) == 2 and set(bad["error_kind"]) == {"http_400"} and bad["status"].tolist() == [400, 400]
    assert df["status"].dtype == "Int64" and df["output_tokens"].isna().sum() == 2
    assert df.loc[0, "param.max_num_seqs"] == 4


def test_runs_frame_one_row_per_repeat() -> None:
    df = runs_frame(unit_input(Path("/nowhere")))
    assert len(df) == 4 and df["metric.output_tok_s"].tolist() == [12.0, 13.0, 12.0, 13.0]
    assert json.loads(df.iloc[2]["errors_by_kind"]) == {"http_400": 1}


def test_export_csv_and_parquet_round_trip(tmp_path: Path) -> None:
    inp = unit_input(tmp_path)
    paths = export_tables(inp, tmp_path / "csv", tmp_path / "pq")
    assert sorted(p.name for p in paths) == sorted(
        ["trials.csv", "runs.csv", "requests.csv", "trials.parquet", "runs.parquet", "requests.parquet"])
    csv = pd.read_csv(tmp_path / "csv" / "requests.csv")
    pq = pd.read_parquet(tmp_path / "pq" / "requests.parquet")
    assert len(csv) == len(pq) == 10
    assert json.loads(csv.loc[0, "chunk_gaps_s"]) == [0.1] * 15  # lists survive CSV as JSON text
    assert list(pq.loc[0, "chunk_gaps_s"]) == [0.1] * 15
    assert len(pd.read_parquet(tmp_path / "pq" / "trials.parquet")) == 6


def test_export_mixed_type_param_column(tmp_path: Path) -> None:
    inp = unit_input(tmp_path)
    inp.view.records[1].params["max_num_seqs"] = "auto"  # ints and a string in one column
    inp.results[1]["params"]["max_num_seqs"] = "auto"
    export_tables(inp, None, tmp_path / "pq")
    assert sorted(pd.read_parquet(tmp_path / "pq" / "requests.parquet")["param.max_num_seqs"].unique()) == [
        "4", "auto"]


def test_export_of_failed_trials_only_keeps_headers(tmp_path: Path) -> None:
    inp = unit_input(tmp_path)
    inp.results = {3: inp.results[3]}  # only the failed trial's file: no samples at all
    export_tables(inp, tmp_path / "csv", None)
    assert "ttft_s" in pd.read_csv(tmp_path / "csv" / "requests.csv").columns
    assert len(pd.read_csv(tmp_path / "csv" / "runs.csv")) == 0


def test_export_without_raw_results_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match="no raw samples"):
        export_tables(ReportInput(view=single_view(), results_dir=tmp_path), tmp_path / "csv")


def test_page_is_self_contained_and_escaped(tmp_path: Path) -> None:
    page = render_html(unit_input(tmp_path))
    for section in ('id="best"', 'id="objective-plot"', 'id="trials"', 'id="importances"',
                    'id="startup-plot"', 'id="failures"'):
        assert section in page
    # nothing is fetched at view time: no external scripts, styles, images or fonts
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', page)
    assert "<link" not in page and "@import" not in page and not re.search(r"url\((?!#)", page)
    # log lines are shown, escaped
    assert "&lt;script&gt;x&lt;/script&gt;" in page and "<script>x</script>" not in page
    assert page.count("<script>") == 1  # only the table sorter
    assert "python -m server --max-num-seqs 24" in page  # the best feasible config's command (#5)
    assert "optuna-dashboard sqlite:///x.db" in page


# ---- a real study, built once per session ---------------------------------------------------------

SPACE = """
name: report-e2e
engines:
  llamacpp:
    dialect: llamacpp
    launcher: process
    command: ["{server}"]
    args:
      ctx_size: 2048
      alias: smollm2
      threads: 1  # robust on a shared 2-core machine: -t 2 collapses when another process holds a core
    ready_timeout_s: 120
models:
  - name: smollm2-135m-q4_1
    path: "{model}"
params:
  parallel: {{type: categorical, choices: [2, 1], default: 2}}
  flash_attn: {{type: categorical, choices: ["on", "off"], default: "on"}}
  cache_type_v: {{type: categorical, choices: [f16, q8_0], default: f16}}
  max_tokens: {{type: categorical, choices: [16, 32], default: 16, side: request}}
measure:
  repeats: 2
  warmup: false
  request_timeout_s: 60
  max_remeasure: 0  # the row counts are asserted: a run flagged as a stall under load stays in (CI saw 34 of 32)
workloads:
  - name: pair
    streams: [qa, math]
    max_tokens: 16
quality:
  suite: null  # answer checks are tested elsewhere; here a wrong answer must not change the trial states
objectives:
  - metric: pair.output_tok_s
    direction: maximize
  - metric: pair.ttft_p50_s
    direction: minimize
constraints:
  - "errors == 0"
budget:
  trials: 6
"""
# After the default (#0): another launch config (#1), a request-side change that reuses #1's
# server (#2), a config llama-server refuses (#3: a quantized V cache needs flash attention: a
# failed start with its cause and log lines), and two more launch configs, so that 5 complete
# trials give parameter importances.
# max_tokens is request-side: a load ladder measured at every start (16 and 32 tokens).
PLANNED = [{"parallel": 1, "flash_attn": "on", "cache_type_v": "f16"},
           {"parallel": 2, "flash_attn": "off", "cache_type_v": "q8_0"},
           {"parallel": 2, "flash_attn": "on", "cache_type_v": "q8_0"},
           {"parallel": 1, "flash_attn": "on", "cache_type_v": "q8_0"}]
FAILED = 2
MEASURED = len(PLANNED)  # the default plus the planned trials, less the failed one
REQUESTS_PER_RUN, REPEATS, POINTS = 2, 2, 2


def search_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "search.cli", *args], capture_output=True, text=True,
                          timeout=1200, check=False)


def build_real_study(base: Path) -> Path:
    """Run the real search once per session (cached under the session's base temp folder)."""
    results = base / "report-study"
    folder = results / "report-e2e"
    if (folder / "DONE").exists():
        return folder
    server = flagsearch_home.llama_server()
    model = flagsearch_home.smollm2_gguf()
    for path, what in ((server, "llama-server"), (model, "the SmolLM2 GGUF")):
        if not path.exists():
            pytest.fail(f"{what} is missing at {path}: run `make setup` first", pytrace=False)
    space = base / "report-e2e.yaml"
    space.write_text(textwrap.dedent(SPACE.format(server=server, model=model)))
    first = search_cli("run", str(space), "--trials", "1", "--results", str(results), "--quiet", "--no-confirm")
    assert first.returncode in (0, 1), first.stdout + first.stderr
    study = optuna.load_study(study_name="report-e2e", storage=f"sqlite:///{folder / 'study.db'}")
    for params in PLANNED:
        study.enqueue_trial(params)
    rest = search_cli("run", str(space), "--trials", str(1 + len(PLANNED)), "--results", str(results),
                      "--quiet", "--no-confirm")
    assert rest.returncode in (0, 1), rest.stdout + rest.stderr
    (folder / "DONE").write_text("ok\n")
    return folder


@pytest.fixture(scope="session")
def real_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_real_study(tmp_path_factory.getbasetemp())


def real_input(folder: Path) -> ReportInput:
    storage = f"sqlite:///{folder / 'study.db'}"
    return load_report_input(optuna.load_study(study_name=folder.name, storage=storage), storage, folder)


@pytest.mark.e2e
def test_real_study_tables(real_study: Path) -> None:
    inp = real_input(real_study)
    states = {r.number: r.state for r in inp.view.records}
    assert states == {n: ("failed" if n == FAILED else "complete") for n in range(1 + len(PLANNED))}, states
    failed = next(r for r in inp.view.records if r.number == FAILED)
    assert failed.failure and failed.failure.log_tail and "q8_0" in failed.command
    assert starts_summary(inp.view) == {"starts": 1 + len(PLANNED), "reused": 0, "duplicates": 0}

    df = requests_frame(inp)
    # Every measured start was measured at both load points; the failed trial measured nothing.
    assert len(df) == MEASURED * POINTS * REPEATS * REQUESTS_PER_RUN
    assert set(df["trial"]) == {n for n in range(1 + len(PLANNED)) if n != FAILED}
    assert set(df["workload"]) == {"pair@max_tokens=16", "pair@max_tokens=32"}
    assert df["ok"].all() and (df["output_tokens"] > 0).all()
    assert (df["ttft_s"] < df["e2e_s"]).all() and (df["tpot_s"] > 0).all()
    assert df.loc[df["workload"] == "pair@max_tokens=16", "output_tokens"].max() <= 16
    assert df.loc[df["workload"] == "pair@max_tokens=32", "output_tokens"].max() <= 32
    runs = runs_frame(inp)
    assert len(runs) == MEASURED * POINTS * REPEATS and (runs["metric.output_tok_s"] > 0).all()
    trials = trials_frame(inp.view).set_index("trial")
    assert trials.loc[0, "pair.output_tok_s ×default"] == pytest.approx(1.0)
    assert not trials["reused_server"].any()
    imp = param_importances(inp.study, inp.view)
    assert imp.reason is None and set(imp.values) == {"pair.output_tok_s", "pair.ttft_p50_s"}


@pytest.mark.e2e
def test_real_study_cli_report(real_study: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    done = search_cli("report", str(real_study), "--html", str(out), "--csv", str(tmp_path / "csv"),
                      "--parquet", str(tmp_path / "pq"))
    assert done.returncode == 0, done.stdout + done.stderr
    page = out.read_text()
    assert "Pareto front" in page and 'id="importances-plot"' in page and 'id="startup-plot"' in page
    assert f"Trial #{FAILED}: " in page and "flash" in page.split(f"Trial #{FAILED}: ")[1][:6000]
    best = real_input(real_study).view.best()
    assert best and all(html.escape(r.command) in page for r in best)
    requests = pd.read_parquet(tmp_path / "pq" / "requests.parquet")
    csv = pd.read_csv(tmp_path / "csv" / "requests.csv")
    assert len(requests) == len(csv) == MEASURED * POINTS * REPEATS * REQUESTS_PER_RUN
    # The study ran with --no-confirm: there is nothing to continue, said in one line, nothing started.
    more = search_cli("confirm", str(real_study), "--more-rounds", "2")
    assert more.returncode == 2 and "no stored confirmation to continue" in more.stderr, more.stderr
    assert "confirmation round" not in more.stdout


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    nothing = search_cli("report", str(tmp_path))
    assert nothing.returncode == 2 and "nothing to write" in nothing.stderr
    missing = search_cli("report", str(tmp_path / "nope"), "--html", str(tmp_path / "x.html"))
    assert missing.returncode == 2 and "no study found" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_duplicates_are_not_drawn_or_classed_as_infeasible_and_commands_are_code(tmp_path: Path) -> None:
    """A duplicate (state duplicate, constraints met) is a copy of another trial: its row is grey,
    never the infeasible class, and no plot draws it as "infeasible (constraint violated)"; the
    verdict's `search confirm` is code, not literal backticks."""
    import html as html_lib

    page = render_html(unit_input(tmp_path))
    rows = re.findall(r'<tr class="([^"]*)">\s*<td[^>]*>(\d+)</td>', page)
    classes = {int(n): c for c, n in rows}
    assert classes[4] == "duplicate" and classes[2] == "infeasible", classes
    view = single_view()
    only_copies = StudyView("unit", view.objectives, [r for r in view.records if r.number != 2], 0)
    svg = objective_plot_svg(only_copies)
    assert "infeasible" not in (svg or ""), "a duplicate was drawn as a constraint violation"
    verdict = re.search(r'id="verdict".*?<strong>(.*?)</strong>', page, re.S)
    assert verdict is not None and "`" not in html_lib.unescape(verdict.group(1)), verdict
    assert "<code>search confirm</code>" in verdict.group(1)
