"""Shared fixtures: real engines started once per test session and shared.

The engines and the model are installed by `make setup` (scripts/setup_*.sh) under
FLAGSEARCH_HOME; a missing one is a setup error, reported as such, never a silent skip.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
import pytest
import yaml
from hypothesis import settings

from harness import (
    Cause,
    EngineSettings,
    Measurement,
    MeasureSettings,
    ModelChoice,
    QualityPlan,
    RunRequest,
    Session,
    TrialFailed,
    flagsearch_home,
)
from harness.launch.base import Server

if TYPE_CHECKING:
    from harness.quality.quality import QualityResult

# `make test` (and so CI) draws the same property-test examples every run (HYPOTHESIS_PROFILE=ci in
# scripts/test.sh): a submission is judged on a known set, not on whatever a new seed finds that day (one
# CI run failed on a storage URL "-:" no earlier run had drawn). `make test-fast` and plain pytest keep
# drawing new examples, which is where new edge cases are found.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
            "VLLM_CACHE_ROOT": str(flagsearch_home.home() / "cache" / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(flagsearch_home.home() / "cache" / "inductor"),
            # vLLM 0.32.0's CPU AOT compile cache never loads back: without it, starts reuse the
            # inductor cache (84 s instead of 135 s for a compiled start; spaces/smollm2-cpu.yaml).
            "VLLM_USE_AOT_COMPILE": "0",
            # One unpinned OpenMP thread, as llama-server's `-t 1`: vLLM's "auto" binding pins every
            # server to the same core of this 2-core machine, so two vLLM processes under pytest-xdist
            # shared one core (a failing start took 140 s instead of 30 s).
            "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1",
            # The model runs in the engine-core process instead of a third process of its own, which
            # imports torch and vLLM once more: ready in 18.1-18.6 s instead of 26.0-27.6 s, the same CPU
            # time (2026-11-28, alone, two starts each; docs/engines.md).
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def require(path: Path, what: str) -> Path:
    if not path.exists():
        pytest.fail(f"{what} is missing at {path}: run `make setup` first", pytrace=False)
    return path


def vllm_settings(**overrides: object) -> EngineSettings:
    python = str(require(flagsearch_home.vllm_python(), "the vLLM-CPU environment"))
    base = dict(name="vllm", dialect="vllm", command=(python, "-m", "vllm.entrypoints.openai.api_server"),
                env=VLLM_ENV, python=python, ready_timeout_s=300.0)
    base.update(overrides)
    return EngineSettings(**base)  # type: ignore[arg-type]


def smollm2_hf() -> ModelChoice:
    return ModelChoice(name="smollm2-135m", path=str(require(flagsearch_home.smollm2_hf(), "the SmolLM2 HF model")))


def smollm2_gguf() -> ModelChoice:
    return ModelChoice(name="smollm2-135m-q4_1", path=str(require(flagsearch_home.smollm2_gguf(), "the SmolLM2 GGUF")))


def llama_settings(**overrides: object) -> EngineSettings:
    binary = str(require(flagsearch_home.llama_server(), "llama-server"))
    base = dict(name="llamacpp", dialect="llamacpp", command=(binary,), ready_timeout_s=60.0)
    base.update(overrides)
    return EngineSettings(**base)  # type: ignore[arg-type]


def llama_request(log_dir: Path, fresh: bool = False, **flags: object) -> RunRequest:
    """A llama-server with SmolLM2 Q4_1 (starts in about a second), run through the door."""
    return RunRequest(llama_settings(), smollm2_gguf(), {"ctx_size": 2048, "parallel": 2, "threads": 1,
                                                          "alias": "smollm2", **flags}, {}, log_dir, fresh=fresh)


def vllm_request(log_dir: Path, flags: dict[str, object], env: dict[str, str] | None = None) -> RunRequest:
    """A vLLM-CPU server with SmolLM2 (eager: ~30 s to ready), run through the door."""
    return RunRequest(vllm_settings(), smollm2_hf(), {"max_model_len": 2048, "enforce_eager": True,
                                                      "served_model_name": "smollm2", **flags}, env or {}, log_dir)


def quality_of(session: Session, request: RunRequest, plan: QualityPlan) -> QualityResult:
    """The quality verdict of one config, through the door: Session.run with no workload, only the
    plan. Garbage answers fail the run (DEGENERATE_OUTPUT), with the result attached: returned too."""
    try:
        measured = session.run(request, [], MeasureSettings(), plan)
    except TrialFailed as exc:
        if exc.failure.cause != Cause.DEGENERATE_OUTPUT or not isinstance(exc.partial, Measurement):
            raise
        measured = exc.partial
    assert measured.quality is not None
    return measured.quality


SHARED_VLLM_FLAGS: dict[str, object] = {"enable_prefix_caching": True}


class _SharedVllm:
    """The session's plain vLLM-CPU server, kept by one door (a Session): tests that run through
    the door with `shared_vllm_request` reuse it, tests that talk to it get it from `get()`. It is
    started again if it died: an in-process CLI test whose error path stops every server this
    process started (reaper.stop_all) also stops this one."""

    def __init__(self, tmp: Path):
        self.tmp, self.session = tmp, Session()

    def request(self, log_dir: Path) -> RunRequest:
        return vllm_request(log_dir, SHARED_VLLM_FLAGS)

    def get(self) -> Server:
        running, _ = self.session.pool.acquire(self.request(self.tmp / f"start{self.session.starts}"))
        return running.server


@pytest.fixture(scope="session", autouse=True)
def _noise_store_of_the_tests(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The runs tests make add their residuals to a noise store of their own (search/verdicts/noise_store.py),
    not to the shared FLAGSEARCH_HOME's, whose spreads later comparisons may borrow."""
    before = os.environ.get("FLAGSEARCH_NOISE")
    os.environ["FLAGSEARCH_NOISE"] = str(tmp_path_factory.mktemp("noise"))
    yield
    if before is None:
        os.environ.pop("FLAGSEARCH_NOISE", None)
    else:
        os.environ["FLAGSEARCH_NOISE"] = before


@pytest.fixture(scope="session")
def _vllm_shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_SharedVllm]:
    shared = _SharedVllm(tmp_path_factory.mktemp("vllm"))
    with shared.session:
        yield shared


@pytest.fixture
def vllm_server(_vllm_shared: _SharedVllm) -> Server:
    """One plain vLLM-CPU server (eager, prefix caching on) shared by the whole session."""
    return _vllm_shared.get()


@pytest.fixture
def vllm_session(_vllm_shared: _SharedVllm) -> tuple[Session, RunRequest]:
    """The door that keeps the shared vLLM-CPU server, and the request that reuses it."""
    return _vllm_shared.session, _vllm_shared.request(_vllm_shared.tmp / "door")


@pytest.fixture(scope="session")
def llama_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    """One door for the whole test session: runs of an equal llama_request reuse its server."""
    with Session() as session:
        yield session


class Quiet:
    """A study reporter (search.study.study.Reporter) that prints nothing: for tests that run a study
    in-process and read its records."""

    def trial_started(self, *args: object) -> None: ...
    def phase(self, text: str) -> None: ...
    def trial_finished(self, record: object) -> None: ...
    def note(self, text: str) -> None: ...


SpaceFactory = Callable[..., dict[str, Any]]


def llama_space_doc(engine_args: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    """The one space builder for tests: a small llama-server space (SmolLM2 Q4_1); `engine_args`
    replaces the engine's fixed args, a keyword any top-level key (params=..., workloads=...)."""
    args = {"ctx_size": 2048, "alias": "smollm2"} if engine_args is None else engine_args
    doc: dict[str, Any] = {
        "name": "test",
        "engines": {"llamacpp": {"command": [str(require(flagsearch_home.llama_server(), "llama-server"))],
                                 "args": args, "ready_timeout_s": 60}},
        "models": [{"name": "smollm2", "path": str(smollm2_gguf().path)}],
        "params": {"threads": {"type": "categorical", "choices": [1, 2], "default": 1}},
        "measure": {"repeats": 1, "request_timeout_s": 30},
        "workloads": [{"name": "w", "streams": ["qa"], "max_tokens": 16}],
        "quality": {"suite": None},
        "objectives": [{"metric": "w.output_tok_s"}],
    }
    return {**doc, **overrides}


@pytest.fixture(scope="session")
def space_doc() -> SpaceFactory:
    """llama_space_doc, as a fixture."""
    return llama_space_doc


TEST_IMAGE = os.environ.get("FLAGSEARCH_TEST_IMAGE", "flagsearch/busybox-host:1")


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    """One client for the session's Docker engine: the one DOCKER_HOST names, else the one
    scripts/dockerd.sh starts under FLAGSEARCH_HOME (DOCKER_HOST is then set, for the launchers and
    the commands tests run), with the test image present; a missing engine is a setup error, never
    a skip."""
    sock = flagsearch_home.home() / "docker" / "docker.sock"
    if "DOCKER_HOST" not in os.environ and sock.exists():
        os.environ["DOCKER_HOST"] = f"unix://{sock}"
    try:
        c = docker.from_env(timeout=60)
        c.ping()
        c.images.get(TEST_IMAGE)
    except docker.errors.DockerException as exc:
        pytest.fail(f"no usable Docker engine ({exc}): run `scripts/dockerd.sh start` first", pytrace=False)
    try:
        yield c
    finally:
        c.close()


def worker_cpu() -> str:
    """This test worker's own CPU (gw0 -> 0, gw1 -> 1, ...; one process without xdist -> 0)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    cpus = sorted(os.sched_getaffinity(0))
    return str(cpus[index % len(cpus)])


def tiny_llama_space(tmp: Path, repeats: int = 3, warmup: bool = True) -> Path:
    """One stream, 16 output tokens, three measured runs after one warmup, no quality suite: seconds per round.
    A test whose sides differ by far more than a run's spread takes fewer runs (`repeats`, `warmup`)."""
    server = require(flagsearch_home.llama_server(), "llama-server")
    model = require(flagsearch_home.smollm2_gguf(), "the SmolLM2 GGUF")
    doc: dict[str, Any] = {
        "name": "bisect-e2e",
        # Pinned to one CPU per test worker: the kept servers of an A/B (--keep-servers) then share
        # it, and with it whatever speed the host gives that CPU. Unpinned, the two sides' servers could
        # sit on different vCPUs of a VM whose speed varies per vCPU for seconds at a time (2026-11-28: a
        # fixed loop 3.8-6.9 ms), and one CI run called a bisect A/A probe "regressed" at -22%.
        "engines": {"llamacpp": {"dialect": "llamacpp", "command": [str(server)],
                                 "args": {"ctx_size": 1024, "parallel": 1, "threads": 1},
                                 "cpus": worker_cpu(), "ready_timeout_s": 60}},
        "models": [{"name": "smollm2-135m-q4_1", "path": str(model), "format": "gguf-q4_1"}],
        "params": {},
        "workloads": [{"name": "single", "streams": ["qa"], "max_tokens": 16}],
        # A round's value is the median of 3 runs of the decode window (about 1% apart on a calm
        # machine; the paired test absorbs what a round shares with the other side).
        "measure": {"repeats": repeats, "warmup": warmup, "max_warmups": 1, "request_timeout_s": 60},
        "objectives": [{"metric": "single.decode_tok_s", "direction": "maximize"}],
        # Its users test gates, builds and workflows: the smoke suite would add 5 s to each side's
        # first two starts (tests/search/test_ab_e2e.py covers quality in a comparison).
        "quality": {"suite": None},
    }
    path = tmp / "space.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Under pytest-xdist (scripts/test.sh), every test of the shared vLLM-CPU server runs on one
    # worker: one start of it, not one per worker.
    # Likewise the tests of the one real study the report tests read (built once per worker).
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if {"vllm_server", "vllm_session"} & names:
            item.add_marker(pytest.mark.xdist_group("vllm"))
        elif {"real_study", "rendered"} & names:
            item.add_marker(pytest.mark.xdist_group("report-study"))


# ---- statistical real-engine tests: which branch each took ---------------------------------------
# A few real-engine tests assert either the detection (a real -10% found, a slower config confirmed
# slower, the first bad build named) or, on a host too noisy for it, the honest fallback (inconclusive,
# with the change it could have seen). Each records the branch it took; the summary counts them, so a
# green suite that never detected anything shows it.
BRANCH = "statistical_branch"


@pytest.fixture
def record_branch(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """record_branch("detected" | "fallback", why): kept on the test's report (xdist carries it)."""
    def record(kind: str, why: str = "") -> None:
        assert kind in ("detected", "fallback"), kind
        request.node.user_properties.append((BRANCH, f"{kind}: {why}" if why else kind))
        print(f"{request.node.name}: took the {kind} branch{': ' + why if why else ''}")
    return record


def pytest_terminal_summary(terminalreporter: Any) -> None:
    taken = [(report.nodeid, value) for key in ("passed", "failed") for report in terminalreporter.stats.get(key, [])
             if getattr(report, "when", "") == "call" for name, value in getattr(report, "user_properties", [])
             if name == BRANCH]
    if not taken:
        return
    detected = sum(1 for _, v in taken if v.startswith("detected"))
    terminalreporter.section("statistical real-engine tests: the branch each took")
    for nodeid, value in taken:
        terminalreporter.write_line(f"{nodeid}: {value}")
    terminalreporter.write_line(f"detected {detected}, fallback {len(taken) - detected} (of {len(taken)}): "
                                + ("no detection ran in this suite" if not detected else "the detection ran"))
