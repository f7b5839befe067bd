"""A soak under random faults: a long study on a real llama-server, faults drawn from a seeded RNG,
then an audit of the study against what was asked, printed as a table.

    .venv/bin/python -m tests.soak --trials 40 --seed 7 [--postgres] [--out tests/soak/soak.json]

`search run --json` runs as a real child process. At each trial it starts, the plan (seeded) draws
no fault or one of:
- engine_kill / engine_stop: SIGKILL / SIGSTOP of the trial's server while it measures;
- port / oom: the next server start finds its port taken, or runs out of memory (tests/soak/engine.py,
  the space's engine command, injects both the way tests/harness/test_faults.py does);
- storage_restart (--postgres only): `scripts/postgres.sh restart` of the study's private PostgreSQL
  while the trial measures;
- tool_kill / tool_term: SIGKILL / SIGTERM of `search run` itself while the trial measures; the soak
  then runs the same command again, which resumes the study.

The audit (search/store/storage.py, search/study/recovery.py): the study holds exactly the trials asked that
count in the budget (duplicates and skips do not), every counted trial has exactly one record, no
trial is left running or queued, each interrupted trial is re-run exactly once, no config was
measured twice, every failure names its cause, and no process started by any `search run` of the
soak outlives it (found by the tag in its environment, harness/launch/reaper.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml

from harness import flagsearch_home
from harness.launch import reaper
from search.store.storage import default_storage

from .audit import Fault, Tally, audit_study, table

ROOT = Path(__file__).resolve().parents[2]

ENGINE_FAULTS = ("engine_kill", "engine_stop")
START_FAULTS = ("port", "oom")
TOOL_FAULTS = ("tool_kill", "tool_term")
KINDS = (*ENGINE_FAULTS, *START_FAULTS, *TOOL_FAULTS)
# What each fault must be recorded as when it hit a trial (a trial can also finish before it lands).
# A recorded cause matches an expected one, or extends it with the request errors ("<cause>/<kinds>").
EXPECTED = {"engine_kill": {"crashed_after_ready", "crashed"},
            "engine_stop": {"unresponsive", "errors/timeout", "objective_missing/timeout"},
            "oom": {"oom"}, "tool_kill": {"interrupted"}, "tool_term": {"interrupted"}}
# Faults the tool absorbs: the trial completes (a taken port: the server is started again on another port).
RECOVERED = ("storage_restart", "port")


@dataclass
class SoakSettings:
    trials: int = 40
    seed: int = 7
    rate: float = 0.5  # chance that a trial gets a fault
    kinds: tuple[str, ...] = KINDS
    postgres: bool = False
    max_tokens: int = 48
    request_timeout_s: float = 15.0
    workdir: Path | None = None


def space_doc(settings: SoakSettings, fault_dir: Path) -> dict[str, Any]:
    binary = flagsearch_home.llama_server()
    if not binary.exists():
        raise SystemExit(f"llama-server is missing at {binary}: run `make setup` first")
    return {
        "name": "soak",
        "engines": {"llamacpp": {
            "dialect": "llamacpp",
            "command": [sys.executable, str(Path(__file__).with_name("engine.py")), str(fault_dir), str(binary)],
            "args": {"threads": 1, "parallel": 1, "flash_attn": "on"},
            "ready_timeout_s": 60,
        }},
        "models": [{"name": "smollm2", "path": str(flagsearch_home.smollm2_gguf())}],
        # 96 configs, all launch flags: every trial is its own start. One thread: two OpenMP threads
        # on a 2-core machine shared with other work can run 10x slower and time out on their own.
        "params": {
            "ctx_size": {"type": "categorical", "choices": [512, 1024, 2048], "default": 1024},
            "batch_size": {"type": "categorical", "choices": [128, 256, 512, 1024], "default": 512},
            "ubatch_size": {"type": "categorical", "choices": [64, 128, 256, 512], "default": 512},
            "cache_type_k": {"type": "categorical", "choices": ["f16", "q8_0"], "default": "f16"},
        },
        "measure": {"repeats": 1, "warmup": False, "request_timeout_s": settings.request_timeout_s},
        "workloads": [{"name": "single", "streams": ["qa"], "max_tokens": settings.max_tokens}],
        # Two objectives: the study runs to its budget (the "nothing left to win" stop is single-objective).
        "objectives": [{"metric": "single.output_tok_s", "direction": "maximize"},
                       {"metric": "single.ttft_p50_s", "direction": "minimize"}],
        "constraints": ["errors == 0"],
        "quality": {"suite": None},
        "budget": {"trials": settings.trials},
        "confirm": {"top_k": 0},
    }


class PrivatePostgres:
    """A PostgreSQL of the soak alone (own port and folder): restarting it disturbs nobody else."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.dir = Path(f"/var/tmp/flagsearch-soak-pg-{port}")  # the postgres user must reach it
        self.env = {**os.environ, "FLAGSEARCH_PG_PORT": str(port), "FLAGSEARCH_PG_DIR": str(self.dir)}
        self._script("start", 180)
        self.url = self._script("url", 30)

    def _script(self, verb: str, timeout_s: float) -> str:
        done = subprocess.run(["bash", str(ROOT / "scripts" / "postgres.sh"), verb], env=self.env,
                              capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise RuntimeError(f"postgres.sh {verb}: {done.stderr.strip()[-300:]}")
        return done.stdout.strip()

    def restart(self) -> None:
        self._script("restart", 120)

    def close(self) -> None:
        subprocess.run(["bash", str(ROOT / "scripts" / "postgres.sh"), "stop"], env=self.env, capture_output=True,
                       timeout=120)
        shutil.rmtree(self.dir, ignore_errors=True)


def owned_by(pids: set[int]) -> list[int]:
    """Live processes started by any of these `search run` processes (by the tag in their environment)."""
    return [proc.pid for proc, owner, _ in reaper.tagged_processes() if owner.split(":")[0] in {str(p) for p in pids}]


class Soak:
    def __init__(self, settings: SoakSettings, work: Path):
        self.s = settings
        self.work = work
        self.plan_rng = random.Random(settings.seed)  # which fault at which trial start
        self.time_rng = random.Random(settings.seed + 1)  # how long after "measuring" it lands
        self.fault_dir = work / "faults"
        self.fault_dir.mkdir(parents=True, exist_ok=True)
        self.results = work / "results"
        self.space = work / "space.yaml"
        self.space.write_text(yaml.safe_dump(space_doc(settings, self.fault_dir), sort_keys=False))
        self.pg = PrivatePostgres() if settings.postgres else None
        self.storage = self.pg.url if self.pg else default_storage(self.results / "soak")
        self.tally = Tally(settings={k: str(v) for k, v in asdict(settings).items()}, asked=settings.trials)
        self.events = 0
        self.pids: set[int] = set()
        self.armed: dict[str, Fault] = {}  # start faults waiting for the next server start
        self.seen_taken: set[str] = set()
        self.restarts: list[threading.Thread] = []

    def command(self) -> list[str]:
        return [sys.executable, "-m", "search.cli", "run", str(self.space), "--results", str(self.results),
                "--study", "soak", "--trials", str(self.s.trials), "--json", "--no-confirm", "--storage",
                self.storage]

    def draw(self) -> str | None:
        kinds = [*self.s.kinds, *(["storage_restart"] if self.pg else [])]
        hit = self.plan_rng.random() < self.s.rate
        kind = self.plan_rng.choice(kinds)
        return kind if hit else None

    def run(self) -> Tally:
        t0 = time.monotonic()
        self.tally.loadavg = (os.getloadavg()[0], 0.0)
        try:
            for _ in range(self.s.trials + 5):  # every resume is asked for by a tool fault
                self.tally.runs += 1
                killed, rc, stderr = self.one_run()
                if killed:
                    continue
                if rc not in (0, 1):  # 1: no feasible config, a fair result
                    self.tally.problems.append(f"run {self.tally.runs} exited {rc}: {stderr.strip()[-300:]}")
                break
            else:
                self.tally.problems.append("the study did not finish within trials + 5 runs")
            for thread in self.restarts:
                thread.join(150)
            self.audit()
        finally:
            time.sleep(0.5)
            deadline = time.monotonic() + 10.0
            while owned_by(self.pids) and time.monotonic() < deadline:
                time.sleep(0.2)
            self.tally.leaked = owned_by(self.pids)
            for pid in self.tally.leaked:  # reported, then stopped: the soak leaves nothing behind either
                os.kill(pid, signal.SIGKILL)
            if self.pg:
                self.pg.close()
        self.tally.wall_s = time.monotonic() - t0
        self.tally.loadavg = (self.tally.loadavg[0], os.getloadavg()[0])
        return self.tally

    # ---- one `search run`, faults injected as its events come ---------------------------------
    def one_run(self) -> tuple[bool, int, str]:
        err_path = self.work / f"run-{self.tally.runs}.err"
        with err_path.open("w") as err:
            proc = subprocess.Popen(self.command(), cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
        self.pids.add(proc.pid)
        watchdog = threading.Timer(900, proc.kill)  # a hung search fails the soak, it does not hang it
        watchdog.start()
        killed = False
        current: int | None = None
        pending: Fault | None = None
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind = event.get("event")
            if kind == "trial_started":
                self.attribute_starts(current)
                current = int(event["number"])
                self.events += 1
                drawn = self.draw()
                pending = None
                if drawn in START_FAULTS and drawn not in self.armed:
                    fault = Fault(drawn, self.events, run=self.tally.runs)
                    self.armed[drawn] = fault
                    self.tally.faults.append(fault)
                    (self.fault_dir / drawn).touch()
                elif drawn is not None and drawn not in START_FAULTS:
                    pending = Fault(drawn, self.events, trial=current, run=self.tally.runs)
            elif kind == "phase" and pending and "measuring" in str(event.get("text", "")):
                self.tally.faults.append(pending)
                killed = self.inject(pending, proc) or killed
                pending = None
        rc = proc.wait()
        watchdog.cancel()
        self.attribute_starts(current)
        return killed, rc, (self.work / f"run-{self.tally.runs}.err").read_text(errors="replace")

    def inject(self, fault: Fault, proc: subprocess.Popen[str]) -> bool:
        """Fire `fault` a random moment into the measurement; True when it stops the tool itself."""
        delay = self.time_rng.uniform(0.0, 0.5)
        if fault.kind in TOOL_FAULTS:
            sig = signal.SIGKILL if fault.kind == "tool_kill" else signal.SIGTERM
            threading.Timer(delay, lambda: proc.poll() is None and proc.send_signal(sig)).start()
            return True
        if fault.kind in ENGINE_FAULTS:
            sig = signal.SIGKILL if fault.kind == "engine_kill" else signal.SIGSTOP

            def hit() -> None:
                for pid in owned_by({proc.pid}):
                    os.kill(pid, sig)
            threading.Timer(delay, hit).start()
        elif fault.kind == "storage_restart" and self.pg is not None:
            thread = threading.Thread(target=self._restart, args=(fault,), daemon=True)
            self.restarts.append(thread)
            thread.start()
        return False

    def _restart(self, fault: Fault) -> None:
        try:
            assert self.pg is not None
            self.pg.restart()
        except Exception as exc:  # the soak's own tooling failing is a problem to report, not a result
            self.tally.problems.append(f"storage restart failed: {exc}")

    def attribute_starts(self, trial: int | None) -> None:
        """A start fault taken by a server belongs to the trial that was running when it started."""
        for path in sorted(self.fault_dir.glob("*.taken.*")):
            if path.name in self.seen_taken:
                continue
            self.seen_taken.add(path.name)
            fault = self.armed.pop(path.name.split(".", 1)[0], None)
            if fault is not None:
                fault.trial = trial

    # ---- the audit ----------------------------------------------------------------------------
    def audit(self) -> None:
        for kind, fault in self.armed.items():
            fault.verdict = "missed: no server start came after it"
            (self.fault_dir / kind).unlink(missing_ok=True)
        study = optuna.load_study(study_name="soak", storage=self.storage)
        self.judge_faults(audit_study(study, self.results / "soak" / "trials", self.tally))

    def judge_faults(self, records: dict[int, dict[str, Any]]) -> None:
        for fault in self.tally.faults:
            if fault.verdict or fault.trial is None:
                fault.verdict = fault.verdict or "missed: no trial took it"
                continue
            record = records.get(fault.trial, {})
            cause = next((f["cause"] for f in self.tally.failures if f["trial"] == fault.trial), "")
            fault.outcome = f"#{fault.trial} {record.get('state', '?')}" + (f": {cause}" if cause else "")
            if fault.kind in RECOVERED:
                fault.verdict = "as expected" if not cause else f"UNEXPECTED: {cause}"
            elif any(cause == e or cause.startswith(e + "/") for e in EXPECTED[fault.kind]):
                fault.verdict = "as expected"
            elif not cause and fault.kind in (*ENGINE_FAULTS, *TOOL_FAULTS):
                fault.verdict = "missed: the trial had finished measuring"
            else:
                fault.verdict = f"UNEXPECTED: {cause or record.get('state')}"


def soak(settings: SoakSettings) -> Tally:
    work = settings.workdir or Path(tempfile.mkdtemp(prefix="flagsearch-soak-"))
    return Soak(settings, work).run()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=40)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--rate", type=float, default=0.5, help="chance that a trial start draws a fault")
    p.add_argument("--kinds", default=",".join(KINDS), help="faults to draw from (comma-separated)")
    p.add_argument("--postgres", action="store_true", help="study on a private PostgreSQL, restarts drawn too")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--request-timeout", type=float, default=15.0, help="seconds (a frozen server costs this)")
    p.add_argument("--out", type=Path, help="write the tally as JSON here")
    a = p.parse_args(argv)
    kinds = tuple(k for k in a.kinds.split(",") if k)
    unknown = set(kinds) - set(KINDS)
    if unknown:
        p.error(f"unknown fault kinds: {sorted(unknown)} (known: {', '.join(KINDS)})")
    settings = SoakSettings(trials=a.trials, seed=a.seed, rate=a.rate, kinds=kinds, postgres=a.postgres,
                            max_tokens=a.max_tokens, request_timeout_s=a.request_timeout)
    tally = soak(settings)
    print(f"soak: {' '.join(sys.argv)}  (seed {a.seed})")
    print(table(tally))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({**asdict(tally), "ok": tally.ok}, indent=1, default=str) + "\n")
    return 0 if tally.ok else 1

