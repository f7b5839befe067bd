"""The side-by-side A/B design (search/regress/side_by_side.py): where each side runs in which round, and what it
refuses before anything starts (lists that overlap or are not on the machine, Docker without cpusets, GPUs)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.launch.cpus import physical_cores
from search.cli import main
from search.regress.ab import ABRun, Subject, noise_key, subject_from
from search.regress.baseline import pinned_space
from search.regress.shared_server import choose_design, design_note
from search.regress.side_by_side import Placement, plan_placement
from search.regress.sides import SideResult
from tests.conftest import llama_space_doc

NO_GPUS: list[str] = []


def one_core_each(cpus: frozenset[int]) -> list[frozenset[int]]:
    return [frozenset({cpu}) for cpu in sorted(cpus)]


def side(label: str, env: dict[str, str] | None = None, **params: Any) -> Subject:
    space, config = pinned_space(llama_space_doc(), {"engine": "llamacpp", "model": "smollm2", "threads": 1,
                                                     **params}, "test")
    return subject_from(space, config, label, env=env)


def docker(subject: Subject, **settings: Any) -> Subject:
    return replace(subject, settings=replace(subject.settings, launcher="docker", image="llama:1", **settings))


def test_the_cpu_lists_swap_every_round_so_each_is_on_both_sides_equally_often() -> None:
    placement = Placement(frozenset({0, 1}), frozenset({2, 3}), "test")
    rounds = [placement.for_round(r) for r in range(4)]
    assert rounds == [{"A": "0-1", "B": "2-3"}, {"A": "2-3", "B": "0-1"}] * 2
    a, b = side("A"), side("B", threads=2)
    given = plan_placement(a, b, "0", "1", available={0, 1}, accelerators=NO_GPUS)
    assert (given.for_round(0), given.for_round(1)) == ({"A": "0", "B": "1"}, {"A": "1", "B": "0"})
    assert given.source == "--cpus-a/--cpus-b"


def test_the_default_split_keeps_a_cores_threads_together_and_leaves_an_odd_core_to_the_client(tmp_path: Path) -> None:
    for cpu, siblings in {0: "0,3", 1: "1,4", 2: "2,5", 3: "0,3", 4: "1,4", 5: "2,5"}.items():
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(siblings + "\n")
    cores = physical_cores(range(6), tmp_path)
    assert cores == [frozenset({0, 3}), frozenset({1, 4}), frozenset({2, 5})]  # numbered n and n + cores
    # This machine's CPUs (each a core of its own here).
    a, b = side("A"), side("B")
    split = plan_placement(a, b, available={0, 1, 2}, accelerators=NO_GPUS, cores_of=one_core_each)
    assert (split.first, split.second) == ({0}, {1}) and "CPU(s) 2 left to the client" in split.source
    # The sides' own `cpus` (both the same) are split, not the host's.
    own = [replace(s, settings=replace(s.settings, cpus="4-7")) for s in (a, b)]
    inside = plan_placement(*own, available=range(8), accelerators=NO_GPUS, cores_of=one_core_each)
    assert (inside.first, inside.second) == ({4, 5}, {6, 7}) and "the sides' own cpus" in inside.source
    with pytest.raises(ValueError, match=r"--design side-by-side: this machine offers 0, 1 physical core"):
        plan_placement(a, b, available={0}, accelerators=NO_GPUS, cores_of=one_core_each)


def test_lists_that_overlap_or_are_not_on_the_machine_are_refused_naming_the_option() -> None:
    a, b = side("A"), side("B")
    with pytest.raises(ValueError, match=r"--cpus-a 0-1 and --cpus-b 1 overlap \(CPU\(s\) 1\)"):
        plan_placement(a, b, "0-1", "1", available={0, 1}, accelerators=NO_GPUS)
    with pytest.raises(ValueError, match=r"--cpus-b 5 names CPU\(s\) 5 that this machine does not offer \(it has 0-1"):
        plan_placement(a, b, "0", "5", available={0, 1}, accelerators=NO_GPUS)
    with pytest.raises(ValueError, match=r"--cpus-a and --cpus-b go together"):
        plan_placement(a, b, "0", None, available={0, 1}, accelerators=NO_GPUS)
    with pytest.raises(ValueError, match=r"--cpus-a: .*'x' in cpu list 'x' is not a cpu number"):
        plan_placement(a, b, "x", "1", available={0, 1}, accelerators=NO_GPUS)


def test_docker_sides_need_the_daemons_cpusets_and_cpus() -> None:
    a, b = side("A"), docker(side("B"))
    with pytest.raises(ValueError, match=r"B's Docker daemon has no cpuset support \(docker info: CpuSet false\)"):
        plan_placement(a, b, "0", "1", available={0, 1}, accelerators=NO_GPUS,
                       daemon_info=lambda: {"CpuSet": False, "NCPU": 8})
    # Swapped every round: a list must be on both sides' machines (this one has 0-1, the daemon's 0-3).
    with pytest.raises(ValueError, match=r"--cpus-b 3 names CPU\(s\) 3 that this machine does not offer"):
        plan_placement(a, b, "0", "3", available={0, 1}, accelerators=NO_GPUS,
                       daemon_info=lambda: {"CpuSet": True, "NCPU": 4})
    both = plan_placement(docker(side("A")), b, None, None, accelerators=NO_GPUS,
                          daemon_info=lambda: {"CpuSet": True, "NCPU": 4})
    assert (both.first, both.second) == ({0, 1}, {2, 3})


def test_a_side_on_a_gpu_is_refused_as_device_splitting_is_not_built() -> None:
    a = side("A")
    cases = {"engine gpus 'all'": docker(side("B"), gpus="all"),
             "flag n_gpu_layers 99": replace(side("B"), flags={**side("B").flags, "n_gpu_layers": 99}),
             "env CUDA_VISIBLE_DEVICES='0'": side("B", env={"CUDA_VISIBLE_DEVICES": "0"})}
    for named, b in cases.items():
        with pytest.raises(ValueError, match=rf"B uses a GPU \({named}\).*CUDA_VISIBLE_DEVICES per side, is not built"):
            plan_placement(a, b, "0", "1", available={0, 1}, accelerators=NO_GPUS,
                           daemon_info=lambda: {"CpuSet": True, "NCPU": 2})
    # A host with a GPU: an engine that does not say it stays off it could share it with the other side.
    with pytest.raises(ValueError, match=r"this host has GPUs \(/dev/nvidia0\) and a side does not say"):
        plan_placement(a, side("B"), "0", "1", available={0, 1}, accelerators=["/dev/nvidia0"])
    off = [side(key, env={"CUDA_VISIBLE_DEVICES": ""}) for key in "AB"]
    assert plan_placement(*off, "0", "1", available={0, 1}, accelerators=["/dev/nvidia0"]).first == {0}


def test_side_by_side_is_asked_for_never_chosen_and_its_report_and_noise_key_say_so() -> None:
    a, b = side("A"), side("B", threads=2)
    assert choose_design(a, b).name == "fresh" and choose_design(a, a).name == "fresh"
    design = choose_design(a, b, "side-by-side")
    assert design.name == "side-by-side" and "--design side-by-side" in design.why
    with pytest.raises(ValueError, match=r"does not go with --keep-servers"):
        choose_design(a, b, "side-by-side", keep_servers=True)
    run = ABRun(SideResult("A"), SideResult("B"), 2, design="side-by-side",
                placement=[{"A": "0", "B": "1"}, {"A": "1", "B": "0"}])
    assert "round 1 A on 0 and B on 1, round 2 the other way" in design_note(design, run)
    assert ABRun.from_dict(run.to_dict()).placement == run.placement
    assert noise_key(run, "w.decode_tok_s") != noise_key(replace(run, design="fresh"), "w.decode_tok_s")
    assert "side-by-side" in noise_key(run, "w.decode_tok_s")


def test_the_command_refuses_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(llama_space_doc()))
    out = tmp_path / "out"
    code = main(["ab", str(space), "--b-set", "threads=2", "--design", "side-by-side", "--cpus-a", "0",
                 "--cpus-b", "0", "--out", str(out), "--quiet"])
    assert code == 2 and "--cpus-a 0 and --cpus-b 0 overlap" in capsys.readouterr().err
    assert not list(out.rglob("server.log"))
    code = main(["ab", str(space), "--b-set", "threads=2", "--cpus-a", "0", "--cpus-b", "1", "--out", str(out),
                 "--quiet"])
    assert code == 2 and "--cpus-a/--cpus-b place the sides of --design side-by-side" in capsys.readouterr().err
