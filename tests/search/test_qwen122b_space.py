"""The flagship space (spaces/qwen122b.yaml): it loads, dry-runs from the CLI with a launch for every
engine and a time estimate, its default is the documents' working setup, and no choice is dead."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from search.space.schema import SpaceError
from search.space.space import load_space, parse_space
from search.study.dryrun import dead_choices, dry_run, engine_defaults
from search.study.estimate import Estimator

QWEN = Path(__file__).resolve().parents[2] / "spaces" / "qwen122b.yaml"


def test_dry_run_from_the_cli_shows_every_engine_feasible_and_the_cost() -> None:
    out = subprocess.run([sys.executable, "-m", "search.cli", "run", str(QWEN), "--dry-run", "8"],
                         capture_output=True, text=True, timeout=300, cwd=QWEN.parent.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    space = load_space(QWEN)
    for engine in space.m.engines:
        assert re.search(rf"^# engine {engine} / \S+ \(feasible\)$", text, re.M), f"{engine} has no feasible launch"
        assert re.search(rf"^#   {engine}: start \d+ s \(", text, re.M), f"{engine} has no time estimate"
    assert len(re.findall(r"^# trial \d+ \((default|queued by the space: |space-filling design )", text, re.M)) == 8
    assert "# dead choices: none" in text
    assert re.search(rf"^# study of {space.m.budget.trials} trials ", text, re.M)
    total = re.search(r"^# total: ([\d.]+)-([\d.]+) h$", text, re.M)  # a range, confirmation included
    assert total and 1 < float(total.group(1)) < float(total.group(2))
    assert re.search(r"^#   confirmation: 2 arms .* x 3-5 rounds of fresh starts: [\d.]+-[\d.]+ h$", text, re.M)
    assert re.search(r"^#   hung starts: 5% \(assumed\) wait for the ready timeout: \+[\d.]+ h$", text, re.M)
    for line in text.splitlines():
        if line.startswith("docker run"):
            words = shlex.split(line)  # a shell can read every printed line
            assert "vllm serve vllm serve" not in line and words[words.index("--network") + 1] == "host"


def test_the_default_is_the_documents_working_setup() -> None:
    space = load_space(QWEN)
    default = space.default_config()
    assert default["engine"] == "vllm_spark" and default["model"] == "sehyo-nvfp4"
    assert default["gpu_memory_utilization"] == 0.9 and default["num_speculative_tokens"] == 2
    assert default["max_model_len"] == 131072 and default["max_num_seqs"] == 4
    assert default["max_num_batched_tokens"] == 8192 and default["kv_cache_dtype"] == "fp8_e4m3"
    assert default["enable_prefix_caching"] is True
    lines = dry_run(space, 1)
    command = lines[lines.index("# trial 0 (default): vllm_spark / sehyo-nvfp4") + 1]
    words = shlex.split(command)
    image = space.m.engines["vllm_spark"].image
    assert words[words.index("--entrypoint") + 1] == "vllm" and words[words.index(image) + 1] == "serve"
    assert json.loads(words[words.index("--speculative-config") + 1]) == {"method": "mtp", "num_speculative_tokens": 2}
    assert "--gpu-memory-utilization 0.9 " in command and "--kv-cache-dtype fp8_e4m3" in command


def test_no_dead_choices() -> None:
    assert dead_choices(load_space(QWEN)) == []


def test_the_checker_finds_dead_choices() -> None:
    # A context no objective's workload fits (qa needs ~300 tokens) and a checkpoint no engine loads.
    doc = yaml.safe_load(QWEN.read_text())
    doc["params"]["atlas_max_seq_len"]["choices"] = [4096, 128]
    doc["engines"]["sglang"]["models"] = ["txn545-nvfp4"]
    doc["engines"]["vllm"]["models"] = ["txn545-nvfp4"]
    doc["engines"]["vllm_spark"]["models"] = ["txn545-nvfp4"]
    doc["engines"]["atlas"]["models"] = ["abliterated-nvfp4"]
    dead = dead_choices(parse_space(doc, "mutated"))
    assert any(d.startswith("atlas_max_seq_len=128") for d in dead), dead
    assert "model 'sehyo-nvfp4': no config fits" in dead and "model 'redhat-nvfp4': no config fits" in dead, dead


def _command_after(lines: list[str], i: int) -> str:
    return next(ln for ln in lines[i + 1:] if not ln.startswith("#"))


def test_mtp_only_where_the_checkpoint_has_mtp_weights() -> None:
    space = load_space(QWEN)
    has_mtp = {m.name: m.has_mtp for m in space.m.models}
    lines = dry_run(space, 40)
    seen = 0
    for i, line in enumerate(lines):
        match = re.match(r"# trial \d+ \(.*\): (\S+) / (\S+)$", line)
        if not match:
            continue
        engine, model = match.groups()
        command = _command_after(lines, i)
        if "--speculative-config" in command or "--speculative " in command or "--speculative-algorithm" in command:
            seen += 1
            assert has_mtp[model], f"MTP asked of {model}, which ships no MTP weights"
        if engine == "atlas":
            words = shlex.split(command)
            assert words[0] == "docker" and "--entrypoint" not in words and "serve" in words
    assert seen > 0


def test_every_checkpoint_says_where_its_facts_come_from() -> None:
    text = QWEN.read_text()
    blocks = re.split(r"(?:^|\n)  - name: ", text.split("\nmodels:\n", 1)[1].split("\nparams:\n", 1)[0])[1:]
    assert len(blocks) == len(load_space(QWEN).m.models)
    for block in blocks:
        comment = " ".join(ln.strip("# ") for ln in block.splitlines() if ln.strip().startswith("#"))
        assert "MTP" in comment, block.splitlines()[0]
        assert re.search(r"GB|size", comment, re.I), block.splitlines()[0]
    assert "YOURS TO EDIT" in text


def test_the_estimate_learns_from_measured_trials() -> None:
    from search.store.results import TrialRecord, TrialState

    space = load_space(QWEN)
    est = Estimator(space)
    declared = est.engine_cost("vllm_spark")
    assert declared.start.source == "declared" and declared.start.seconds == 720
    for n, (ready, wall) in enumerate([(600.0, 2400.0), (640.0, 2440.0)]):
        est.observe(TrialRecord(number=n, state=TrialState.COMPLETE, params={}, engine="vllm_spark",
                                model="sehyo-nvfp4", ready_s=ready, wall_s=wall))
    learned = est.engine_cost("vllm_spark")
    assert learned.start.seconds == 620 and learned.start.source == "measured, 2 trials"
    assert learned.measure.seconds == 1800 and learned.trial_s == 2420
    assert est.remaining_s(3) == 3 * est.trial_s()


def test_a_confirmation_start_is_priced_with_the_confirmations_own_runs() -> None:
    """`confirm.repeats` runs per confirmation start, not the trials' `measure.repeats`: each run
    more costs one more pass of the objective's workload on every engine."""
    doc = yaml.safe_load(QWEN.read_text())
    doc.setdefault("confirm", {}).pop("repeats", None)
    plain = Estimator(parse_space(doc, "qwen"))
    repeats = plain.space.m.measure.repeats
    doc["confirm"]["repeats"] = repeats + 2
    more = Estimator(parse_space(doc, "qwen"))
    engines = list(plain.space.m.engines)
    start = sum(plain.engine_cost(e).start.seconds for e in engines) / len(engines)
    passes = repeats + (1 if plain.space.m.measure.warmup else 0)
    one_pass = (plain.confirmation_start_s() - start) / passes
    assert one_pass > 0
    assert abs(more.confirmation_start_s() - plain.confirmation_start_s() - 2 * one_pass) < 1e-6 * start


def test_the_study_estimate_is_a_range_with_confirmation_failures_and_hung_starts() -> None:
    from harness.failure import Failure
    from search.store.results import TrialRecord, TrialState
    from search.study.estimate import MIN_CONFIRM_ROUNDS

    space = load_space(QWEN)
    est = Estimator(space)
    cost = est.study(16)
    assert cost.fail_source == "assumed" and cost.confirm_s[0] > 0
    # The shortest confirmation: the default and the top config, 3 fresh starts each.
    assert cost.confirm_s == (MIN_CONFIRM_ROUNDS * 2 * est.confirmation_start_s(), 5 * 2 * est.confirmation_start_s())
    assert cost.low_s < cost.trials_s + cost.confirm_s[0] < cost.high_s
    # --budget-hours commits a trial only with the shortest confirmation after it.
    assert est.needed_s("atlas") == est.trial_s("atlas") + cost.confirm_s[0]
    # Under `search run --no-confirm` no confirmation follows: the budget reserves none, the estimate shows none.
    est.confirm = False
    assert est.needed_s("atlas") == est.trial_s("atlas") and est.study(16).confirm_s == (0.0, 0.0)
    assert "#   confirmation: none (--no-confirm)" in est.lines(16)
    est.confirm = True
    # One trial is the default alone: nothing to confirm, so no start is priced for it (no control here).
    assert not space.m.confirm.controls and est.study(1).confirm_s == (0.0, 0.0) and est.study(1).arms == 0
    assert "#   confirmation: none (one trial is the default alone: nothing to confirm)" in est.lines(1)
    for n, failure in enumerate([None, None, Failure("oom", "x"), Failure("timeout", "never ready"),
                                 Failure("memory_held", "not the config"), Failure("wont_fit", "before launch")]):
        est.observe(TrialRecord(number=n, state=TrialState.FAILED if failure else TrialState.COMPLETE, params={},
                                engine="vllm_spark", model="sehyo-nvfp4", ready_s=600.0, wall_s=2400.0,
                                failure=failure))
    measured = est.study(16)
    assert (measured.fail_rate, measured.hang_rate, measured.fail_source) == (0.25, 0.25, "measured over 4 trials")
    assert measured.hung_extra_s > cost.hung_extra_s


def test_no_environment_variable_is_added_to_every_start() -> None:
    """The documents' working setup sets no VLLM_* variable: no param sets one by default, so each
    engine's default launch carries only its own `env:` (the documented `docker run`'s)."""
    space = load_space(QWEN)
    for engine, e in space.m.engines.items():
        assert not any(k.startswith("VLLM_") for k in e.env), engine
    for launch in engine_defaults(space):
        assert space.split(launch.config)[1] == {}, launch.config.engine
    assert not [name for name, p in space.m.params.items() if p.env], "a param sets an environment variable"
    lines = dry_run(space, 8)
    assert not [ln for ln in lines if ln.startswith("docker run") and " -e VLLM_" in ln]


def test_docker_options_of_the_images_reach_the_launch_and_a_gpu_container_without_shm_is_warned() -> None:
    space = load_space(QWEN)
    spark = space.engine_settings("vllm_spark")
    assert [(u.name, u.soft, u.hard) for u in spark.ulimits] == [("nofile", 1048576, 1048576)]
    lines = dry_run(space, 1)
    command = lines[lines.index("# trial 0 (default): vllm_spark / sehyo-nvfp4") + 1]
    assert "--ulimit nofile=1048576:1048576" in command
    assert not [ln for ln in lines if "/dev/shm" in ln]  # every GPU engine has ipc_host
    doc = yaml.safe_load(QWEN.read_text())
    doc["engines"]["sglang"]["ipc_host"] = False
    doc["engines"]["vllm"].update(ipc_host=False, shm_size="64g", cap_add=["IPC_LOCK"], devices=["/dev/infiniband"],
                                  mem_limit="110g", memswap_limit="120g", pids_limit=4096,
                                  ulimits={"memlock": [-1, -1]})
    mutated = parse_space(doc, "mutated.yaml")
    warnings = [ln for ln in dry_run(mutated, 1) if "/dev/shm" in ln]
    assert warnings == ["# warning: mutated.yaml: engines.sglang: a GPU container with neither ipc_host nor "
                        "shm_size runs with Docker's 64 MB /dev/shm (PyTorch and NCCL keep shared memory there); "
                        "set ipc_host: true, or shm_size: 64g"]
    vllm = mutated.engine_settings("vllm")
    assert (vllm.cap_add, vllm.devices, vllm.mem_limit, vllm.memswap_limit, vllm.pids_limit) == \
        (("IPC_LOCK",), ("/dev/infiniband",), "110g", "120g", 4096)
    assert [(u.name, u.soft, u.hard) for u in vllm.ulimits] == [("memlock", -1, -1)]


def test_container_options_on_a_process_engine_or_a_bad_ulimit_are_load_errors() -> None:
    doc = yaml.safe_load(QWEN.read_text())
    doc["engines"]["atlas"]["ulimits"] = {"nofile": "lots"}
    with pytest.raises(SpaceError, match=r"ulimits.nofile: 'lots' is not a number or \[soft, hard\]"):
        parse_space(doc, "bad.yaml")
    doc = yaml.safe_load(QWEN.read_text())
    doc["engines"]["atlas"]["launcher"] = "process"
    doc["engines"]["atlas"]["mem_limit"] = "1g"
    with pytest.raises(SpaceError, match="options of a container; set launcher: docker"):
        parse_space(doc, "bad.yaml")


def test_kv_sequences_of_the_documented_setup_come_from_vllms_concurrency_line() -> None:
    """The trial's kv metrics at the space's kv_context_tokens, from the documented startup log: 12
    sequences of 131,072 (vLLM's 12.89x), not the 4 its one-group token figure (595,584) gives."""
    from harness.engines import get_engine
    from harness.session import Measurement
    from search.study.scoring import kv_metrics

    log = (QWEN.parents[1] / "tests" / "data" / "vllm_gpu_documented.log").read_text()
    measured = Measurement(command="", env={}, log_path="", ready_s=0.0, reused_server=False,
                           startup=get_engine("vllm").parse_startup(log), fingerprint={}, dialect="vllm")
    context = load_space(QWEN).m.measure.kv_context_tokens
    assert context == 131072
    assert kv_metrics(measured, context) == {"kv.cache_tokens": 595584.0, "kv.max_sequences": 12.89,
                                             "kv.sequences": 12.0}
