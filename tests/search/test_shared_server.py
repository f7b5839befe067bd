"""The A/B design choice (search/regress/shared_server.py): one shared server when the sides differ only in
request-side parameters, fresh starts otherwise; what a shared run's sides and noise store entry say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from search.regress.ab import ABRun, Subject, noise_key, subject_from
from search.regress.baseline import pinned_space
from search.regress.shared_server import (
    blocks_of,
    by_blocks,
    choose_design,
    design_note,
    launch_differences,
    run_shared,
    share_server,
)
from search.regress.sides import SideResult, resolve_source
from search.space.space import Space
from tests.conftest import llama_space_doc

REQUEST_SIDE_DOC = llama_space_doc(params={
    "threads": {"type": "categorical", "choices": [1, 2], "default": 1},
    "max_tokens": {"type": "categorical", "choices": [8, 32], "default": 8, "side": "request"}})


def side(label: str, **params: Any) -> tuple[Subject, Space]:
    values = {"engine": "llamacpp", "model": "smollm2", "threads": 1, "max_tokens": 8, **params}
    space, config = pinned_space(REQUEST_SIDE_DOC, values, "test")
    return subject_from(space, config, label), space


def test_sides_that_differ_only_in_a_request_side_parameter_share_one_server() -> None:
    (a, _), (b, _) = side("A"), side("B", max_tokens=32)
    assert launch_differences(a, b) == []
    design = choose_design(a, b)
    assert design.name == "shared"
    assert "max_tokens: A 8, B 32" in design.why and "need no restart" in design.why
    # --keep-servers changes nothing here: one server is fewer than two kept ones.
    assert choose_design(a, b, keep_servers=True).name == "shared"
    assert choose_design(a, b, "fresh").name == "fresh"


def test_a_launch_side_difference_keeps_fresh_starts_and_says_which() -> None:
    (a, _), (b, _) = side("A"), side("B", threads=2, max_tokens=32)
    assert launch_differences(a, b) == ["flag threads: A 1, B 2"]
    design = choose_design(a, b)
    assert design.name == "fresh" and "flag threads: A 1, B 2" in design.why
    assert choose_design(a, b, keep_servers=True).name == "kept"
    with pytest.raises(ValueError, match=r"do not start the same server.*flag threads"):
        choose_design(a, b, "shared")
    env = subject_from(*pinned_space(REQUEST_SIDE_DOC, {"engine": "llamacpp", "model": "smollm2"}, "t"), "B",
                       env={"LLAMA_X": "1"}, command="/other/llama-server")
    assert set(launch_differences(a, env)) >= {"env LLAMA_X: A None, B '1'",
                                               f"engine command: A {a.settings.command!r}, B ('/other/llama-server',)"}


def test_an_aa_keeps_fresh_starts_unless_the_shared_server_is_asked_for() -> None:
    (a, _), (b, _) = side("A"), side("B")
    design = choose_design(a, b)
    assert design.name == "fresh" and "same config" in design.why
    shared = choose_design(a, b, "shared")
    assert shared.name == "shared" and "as asked" in shared.why
    with pytest.raises(ValueError, match="design 'both'"):
        choose_design(a, b, "both")


def test_run_shared_refuses_sides_that_start_different_servers(tmp_path: Path) -> None:
    (a, space), (b, _) = side("A"), side("B", threads=2)
    with pytest.raises(ValueError, match="flag threads"):
        run_shared(a, b, space.workload_specs(), space.workload_specs(), None, 3, tmp_path)  # type: ignore[arg-type]


def test_each_side_measures_its_own_request_side_values(tmp_path: Path) -> None:
    """`--b-set max_tokens=32` on a request-side parameter reaches B's workloads (it was dropped with the
    config's sampled values, so both sides ran the workload's own max_tokens)."""
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(REQUEST_SIDE_DOC))
    source = resolve_source(str(path), {"max_tokens": 32})
    assert source.space.resolve(source.config).request == {"max_tokens": 32}
    with pytest.raises(ValueError, match="max_tokens=9: not one of the values"):
        resolve_source(str(path), {"max_tokens": 9})
    (a, space), (b, _) = side("A"), side("B", max_tokens=32)
    assert [w.max_tokens for w in space.workload_specs(dict(a.request))] == [8]
    assert [w.max_tokens for w in space.workload_specs(dict(b.request))] == [32]


def shared_run() -> ABRun:
    a = SideResult("A", command="llama-server -m m", log_paths=["logs/A-round01/server.log"],
                   fingerprint={"host": "h", "engine": "llamacpp", "model_id": "m"}, startup={"version": "1"},
                   samples={"startup.ready_s": [0.6], "w.decode_tok_s": [80.0, 81.0, 79.0]},
                   runs={"w.decode_tok_s": [[80.0], [81.0], [79.0]]})
    b = SideResult("B", samples={"w.decode_tok_s": [70.0, 71.0, 69.0]},
                   runs={"w.decode_tok_s": [[70.0], [71.0], [69.0]]})
    return ABRun(a, b, 3, order=["A", "B", "B", "A", "A", "B"], design="shared")


def test_a_shared_run_gives_b_the_one_servers_identity_and_no_startup_comparison() -> None:
    run = shared_run()
    assert share_server(run) == 1
    assert run.b.command == "llama-server -m m" and run.b.fingerprint == run.a.fingerprint
    assert run.b.log_paths == run.a.log_paths == ["logs/A-round01/server.log"] and run.b.startup == {"version": "1"}
    assert "startup.ready_s" not in run.a.samples and "startup.ready_s" not in run.b.samples
    (a, _), (b, _) = side("A"), side("B", max_tokens=32)
    note = design_note(choose_design(a, b), run)
    assert note.startswith("design: one shared server") and "1 server start, 3 blocks a side" in note
    assert "no start-to-start term" in note


def test_a_shared_runs_noise_is_stored_apart_from_fresh_and_kept_starts() -> None:
    run = shared_run()
    share_server(run)
    shared_key = noise_key(run, "w.decode_tok_s")
    run.design = "fresh"
    assert shared_key.endswith("-w-shared-decode_tok_s") and noise_key(run, "w.decode_tok_s") != shared_key


def test_alternating_runs_are_paired_as_whole_blocks_and_the_stop_rule_looks_at_blocks() -> None:
    """Seven one-run turns a side (A B, B A, ...) with 3 runs a block: two whole blocks a side, paired block by
    block; the unfinished third block is left out; counts are summed over a block, values by their median."""
    values_a = [100.0, 101.0, 99.0, 98.0, 102.0, 100.0, 97.0]
    values_b = [90.0, 91.0, 89.0, 92.0, 90.0, 88.0, 93.0]
    a = SideResult("A", runs={"w.decode_tok_s": [[v] for v in values_a]},
                   samples={"w.decode_tok_s": values_a, "w.requests": [1.0] * 7, "startup.ready_s": [0.5]})
    b = SideResult("B", runs={"w.decode_tok_s": [[v] for v in values_b]},
                   samples={"w.decode_tok_s": values_b, "w.requests": [1.0] * 7})
    turns = ABRun(a, b, 7, order=["A", "B", "B", "A"] * 3 + ["A", "B"], design="shared")
    run = blocks_of(turns, 3)
    assert run.rounds_done == 2 and run.order == turns.order and run.design == "shared"
    assert run.a.runs["w.decode_tok_s"] == [[100.0, 101.0, 99.0], [98.0, 102.0, 100.0]]
    assert run.b.runs["w.decode_tok_s"] == [[90.0, 91.0, 89.0], [92.0, 90.0, 88.0]]
    assert run.a.samples["w.requests"] == [3.0, 3.0] and run.a.samples["w.decode_tok_s"] == [100.0, 100.0]
    assert turns.a.runs["w.decode_tok_s"][0] == [100.0]  # the turns themselves are left as measured
    seen: list[int] = []

    def stop(r: ABRun) -> str | None:
        seen.append(r.rounds_done)
        r.looks = [2, 3]
        return "settled" if r.rounds_done == 2 else None

    rule = by_blocks(stop, 3)
    answers = {}
    for done in range(1, 8):
        turns.rounds_done = done
        answers[done] = rule(turns)
    assert seen == [1, 2] and answers[6] == "settled" and answers[3] is None and answers[4] is None
    assert turns.looks == [2, 3]  # the plan's looks, in blocks, kept on the run that is reported
