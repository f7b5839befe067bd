"""Ground-truth table of llama-server (CUDA) configs: every config started fresh several times, each
start measured at 1 stream and at 4 concurrent streams (256 output tokens, ignore_eos), each load
with its repeats. One CSV row per measured run (long format; columns in docs/gpu-llamacpp.md).

    python3 bench/gpu/table.py run --plan table --starts 2 --csv T.csv        # ~48 configs x 2 starts
    python3 bench/gpu/table.py run --plan calib --configs base,kq8 --starts 12 --csv C.csv
    python3 bench/gpu/table.py run --plan calib --configs base,base --model random-7b-f16.gguf --pin 0-7 \
        --run big --csv C.csv                                                  # another setup, one CSV
    python3 bench/gpu/table.py show T.csv                                      # Markdown table

A setup (the model file in $FSGPU, output tokens, CPUs the server is pinned to) holds for a whole
`run` call and is written beside every row with the name `--run`, so several setups share a CSV.
`run` appends to the CSV and skips (run, config, start) triples already in it, so a run cut by a time
limit (`--deadline-s`) resumes where it stopped. The order is interleaved: start 0 of every config
(shuffled), then start 1, ..., so drift over time lands in the between-start spread, not in one
config. `--plan calib` runs rounds of a few configs in rotated order (A/A and config pairs for the
gate's power, bench/gpu_power.py). Self-contained (httpx + stdlib) so that it runs unchanged on the
GPU machine while the harness evolves; its metrics follow harness.client's definitions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import itertools
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

FSGPU = Path(os.environ.get("FSGPU", "/tmp/fsgpu"))
PROMPTS = (  # the qa, code, json and math prompts of harness/data/workloads.yaml
    "In two or three sentences, why is the sky blue?",
    "Write a Python function binary_search(items, target) that returns the index of target in the sorted list "
    "items, or -1. Include a docstring and three example calls.",
    "Extract the invoice fields as JSON with keys invoice_number, date, vendor, total, currency and line_items "
    "(each with description, quantity, unit_price): Invoice INV-2024-0193 dated 2024-03-14 from Acme Tools Ltd. "
    "3 x hammer at 12.50 EUR, 2 x saw at 24.00 EUR, 10 x nails pack at 1.20 EUR. Total 97.50 EUR.",
    "What is 17 multiplied by 23? Answer with the number only.",
)
MAX_TOKENS = 256
COLUMNS = ("plan", "config", "fa", "batch", "ubatch", "cache_k", "cache_v", "parallel", "ngl", "load", "start",
           "repeat", "status", "tok_s", "ttft_s", "decode_tok_s", "output_tokens", "wall_s", "ready_s", "card",
           "machine", "unix_time", "note", "label", "run", "model", "pin", "max_tokens")


@dataclass(frozen=True)
class Config:
    fa: str = "on"
    batch: int = 2048
    ubatch: int = 512
    cache_k: str = "f16"
    cache_v: str = "f16"
    parallel: int = 4
    ngl: int = 99
    extra: tuple[str, ...] = ()  # any other llama-server flags, e.g. ("-t", "2")

    @property
    def name(self) -> str:
        return (f"fa={self.fa} b={self.batch} ub={self.ubatch} kv={self.cache_k}/{self.cache_v} "
                f"np={self.parallel} ngl={self.ngl}" + "".join(f" {x}" for x in self.extra))

    def args(self) -> list[str]:
        return ["-fa", self.fa, "-b", str(self.batch), "-ub", str(self.ubatch), "--cache-type-k", self.cache_k,
                "--cache-type-v", self.cache_v, "-np", str(self.parallel), "-ngl", str(self.ngl), *self.extra]


def table_plan() -> list[Config]:
    """48 configs: the full grid 2 (-fa) x 2 (-b/-ub) x 3 (K/V cache) x 2 (-np) x 2 (-ngl).
    -ngl 22 keeps the output layer (131 MB of the 2.2 GB) on the CPU; a q8_0 V cache without flash
    attention is refused by llama.cpp, so those 8 configs are recorded as failed starts."""
    grid = itertools.product(("on", "off"), ((2048, 512), (512, 128)), (("f16", "f16"), ("q8_0", "f16"),
                             ("q8_0", "q8_0")), (4, 1), (99, 22))
    return [Config(fa, b, ub, k, v, np_, ngl) for fa, (b, ub), (k, v), np_, ngl in grid]


NAMED: dict[str, Config] = {  # short names for --plan calib
    "base": Config(),
    "kq8": Config(cache_k="q8_0"),
    "vq8": Config(cache_v="q8_0"),
    "kvq8": Config(cache_k="q8_0", cache_v="q8_0"),
    "ub128": Config(ubatch=128),
    "b512": Config(batch=512, ubatch=128),
    "np1": Config(parallel=1),
    "ngl22": Config(ngl=22),
    "faoff": Config(fa="off"),
    "kvbf16": Config(cache_k="bf16", cache_v="bf16"),
    "t2": Config(extra=("-t", "2")),
    "poll0": Config(extra=("--poll", "0")),
    # one small weight (layer 31's K projection: 8 MiB on the 7B shape) computed on the CPU: a small
    # real slowdown for a known-difference pair on the big model
    "otk31": Config(extra=("-ot", r"blk\.31\.attn_k\.weight=CPU")),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def one_request(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> dict[str, float]:
    body = {"model": "random-1b", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "stream": True, "ignore_eos": True, "temperature": 0.0, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft: float | None = None
    tokens = 0
    chunks = 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if data.get("usage"):
                tokens = int(data["usage"].get("completion_tokens") or tokens)
            for choice in data.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    chunks += 1
                    if ttft is None:
                        ttft = time.perf_counter() - t0
    e2e = time.perf_counter() - t0
    tokens = tokens or chunks
    ttft = ttft if ttft is not None else e2e
    decode = (tokens - 1) / (e2e - ttft) if tokens > 1 and e2e > ttft else float("nan")
    return {"tokens": tokens, "ttft": ttft, "e2e": e2e, "decode": decode}


async def measure_load(url: str, streams: int, max_tokens: int) -> dict[str, float]:
    """One run: `streams` concurrent requests; tok/s = all output tokens / wall time of the run."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one_request(client, url, PROMPTS[i % len(PROMPTS)], max_tokens)
                                         for i in range(streams)))
        wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in results)
    return {"tok_s": tokens / wall, "ttft_s": statistics.median(r["ttft"] for r in results),
            "decode_tok_s": statistics.median(r["decode"] for r in results), "output_tokens": tokens,
            "wall_s": wall}


@dataclass(frozen=True)
class Setup:
    """What holds for every start of one `run` call."""
    name: str = ""
    model: str = "random-1b-f16.gguf"  # a file in $FSGPU
    pin: str = ""  # taskset CPU list for llama-server ("" = not pinned)
    max_tokens: int = MAX_TOKENS

    def columns(self) -> dict[str, object]:
        return {"run": self.name, "model": self.model, "pin": self.pin, "max_tokens": self.max_tokens}


class Server:
    def __init__(self, cfg: Config, log: Path, setup: Setup) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        pin = ["taskset", "-c", setup.pin] if setup.pin else []
        cmd = [*pin, str(FSGPU / "bin" / "llama-server"), "-m", str(FSGPU / setup.model), "--host", "127.0.0.1",
               "--port", str(self.port), "-c", "16384", "--alias", "random-1b", *cfg.args()]
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log
        self.proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout_s: float = 180.0) -> float:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited {self.proc.returncode}: {self.cause()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"not ready in {timeout_s:.0f} s")

    def cause(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        # the first error line names the cause; later ones ("exiting due to model loading error") only follow
        bad = [ln for ln in lines if " E " in ln or "error" in ln.lower() or "invalid" in ln.lower()]
        return ((bad or lines[-1:] or ["(empty log)"])[0]).strip()[:200]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def card_and_machine() -> tuple[str, str]:
    try:
        card = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        card = "unknown"
    boot = Path("/proc/sys/kernel/random/boot_id")
    return card, (boot.read_text().strip()[:8] if boot.exists() else socket.gethostname())


def measure_start(cfg: Config, plan: str, start: int, loads: dict[int, int], card: str, machine: str,
                  logdir: Path, label: str, setup: Setup = Setup()) -> list[dict[str, object]]:
    base: dict[str, object] = {"plan": plan, "config": cfg.name, "label": label, "fa": cfg.fa, "batch": cfg.batch,
                               "ubatch": cfg.ubatch, "cache_k": cfg.cache_k, "cache_v": cfg.cache_v,
                               "parallel": cfg.parallel, "ngl": cfg.ngl, "start": start, "card": card,
                               "machine": machine, **setup.columns()}
    server = Server(cfg, logdir / f"{setup.name}{plan}-{start}-{label.replace(' ', '_').replace('/', '-')}.log",
                    setup)
    rows: list[dict[str, object]] = []
    try:
        try:
            ready = server.wait_ready()
        except RuntimeError as exc:
            return [{**base, "status": "failed", "unix_time": round(time.time(), 1), "note": str(exc)}]
        for streams, repeats in loads.items():
            for rep in range(-1, repeats):  # repeat -1: warmup (graphs, slots, caches), not recorded
                try:
                    m = asyncio.run(measure_load(server.url, streams, 32 if rep < 0 else setup.max_tokens))
                    if rep >= 0:
                        rows.append({**base, "load": streams, "repeat": rep, "status": "ok",
                                     "ready_s": round(ready, 3), "unix_time": round(time.time(), 1),
                                     **{k: round(v, 5) for k, v in m.items()}})
                except (httpx.HTTPError, RuntimeError, ValueError) as exc:
                    with contextlib.suppress(subprocess.TimeoutExpired):  # a crashed server exits a moment later
                        server.proc.wait(3)
                    dead = server.proc.poll() is not None
                    note = f"{type(exc).__name__}: {exc}"[:120] + (f"; server exited: {server.cause()}" if dead else "")
                    rows.append({**base, "load": streams, "repeat": rep, "status": "error",
                                 "unix_time": round(time.time(), 1), "note": note[:300]})
                    if dead:
                        return rows
    finally:
        server.stop()
    return rows


def done_pairs(path: Path, plan: str, run_name: str) -> set[tuple[str, int]]:
    if not path.exists():
        return set()
    with path.open() as f:
        return {(r.get("label") or r["config"], int(r["start"])) for r in csv.DictReader(f)
                if r["plan"] == plan and (r.get("run") or "") == run_name}


def run(a: argparse.Namespace) -> None:
    t0 = time.time()
    card, machine = card_and_machine()
    if a.plan == "table":
        configs = [(c.name, c) for c in table_plan()]
        loads = {1: a.repeats, 4: a.repeats}
    else:  # a name given twice (A/A) gets two labels, base.1 and base.2: two configs that are the same
        names = a.configs.split(",")
        configs = [(f"{n}.{names[:i].count(n) + 1}" if names.count(n) > 1 else n, NAMED[n])
                   for i, n in enumerate(names)]
        loads = {1: a.repeats_calib}
        if a.four:
            loads[4] = a.repeats
    setup = Setup(a.run, a.model, a.pin, a.max_tokens)
    done = done_pairs(a.csv, a.plan, a.run)
    new = not a.csv.exists()
    rng = random.Random(a.seed)
    with a.csv.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            writer.writeheader()
        for start in range(a.starts):
            order = list(configs)
            if a.plan == "table":
                rng.shuffle(order)
            else:  # rotated, so that no config always goes first
                order = order[start % len(order):] + order[: start % len(order)]
            for label, cfg in order:
                if (label, start) in done:
                    continue
                if time.time() - t0 > a.deadline_s:
                    print(f"deadline reached after {time.time() - t0:.0f} s", flush=True)
                    return
                rows = measure_start(cfg, a.plan, start, loads, card, machine, a.logdir, label, setup)
                writer.writerows(rows)
                f.flush()
                ok = [r for r in rows if r["status"] == "ok"]
                summary = {ld: round(statistics.median(float(r["tok_s"]) for r in ok if r["load"] == ld), 1)
                           for ld in loads if any(r["load"] == ld for r in ok)}
                print(f"[{time.time() - t0:5.0f} s] {a.run} start {start} {label}: "
                      f"{summary or rows[0].get('note')}", flush=True)


def show(path: Path) -> str:
    with path.open() as f:
        rows = list(csv.DictReader(f))
    cells: dict[tuple[str, str], list[float]] = {}
    ttft: dict[tuple[str, str], list[float]] = {}
    failed: dict[str, str] = {}
    order: list[str] = []
    for r in rows:
        if r["config"] not in order:
            order.append(r["config"])
        if r["status"] == "failed":
            failed[r["config"]] = r["note"]
        elif r["status"] == "ok":
            cells.setdefault((r["config"], r["load"]), []).append(float(r["tok_s"]))
            ttft.setdefault((r["config"], r["load"]), []).append(float(r["ttft_s"]))
    cards = sorted({r["card"] for r in rows})
    lines = [f"Card: {', '.join(cards)}; {len(rows)} rows. Cells: median tok/s over all runs of all starts "
             "(min-max), n runs.", "", "| config | 1 stream tok/s | n | TTFT ms | 4 streams tok/s | n | TTFT ms |",
             "|---|---|---|---|---|---|---|"]
    for cfg in sorted(order, key=lambda c: -statistics.median(cells.get((c, "1"), [0.0]))):
        if cfg in failed and (cfg, "1") not in cells:
            lines.append(f"| {cfg} | failed: {failed[cfg][:60]} | | | | | |")
            continue
        parts = []
        for load in ("1", "4"):
            v = cells.get((cfg, load), [])
            t = ttft.get((cfg, load), [])
            parts += ([f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})", str(len(v)),
                       f"{1e3 * statistics.median(t):.1f}"] if v else ["-", "0", "-"])
        lines.append(f"| {cfg} | " + " | ".join(parts) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--plan", choices=("table", "calib"), default="table")
    r.add_argument("--configs", default="base,kq8,kvq8", help="calib: names from NAMED, comma-separated")
    r.add_argument("--starts", type=int, default=2)
    r.add_argument("--repeats", type=int, default=3, help="measured runs per load per start")
    r.add_argument("--repeats-calib", type=int, default=5, help="calib: measured 1-stream runs per start")
    r.add_argument("--four", action="store_true", help="calib: also measure 4 streams")
    r.add_argument("--csv", type=Path, required=True)
    r.add_argument("--logdir", type=Path, default=FSGPU / "table-logs")
    r.add_argument("--deadline-s", type=float, default=1e9, help="start no new server after this many seconds")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--run", default="", help="setup name written in every row (the `run` column)")
    r.add_argument("--model", default="random-1b-f16.gguf", help="GGUF file in $FSGPU")
    r.add_argument("--pin", default="", help="taskset CPU list for llama-server, e.g. 0-7")
    r.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="output tokens of a measured run")
    s = sub.add_parser("show")
    s.add_argument("csv", type=Path)
    a = p.parse_args()
    if a.cmd == "run":
        run(a)
    else:
        print(show(a.csv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
