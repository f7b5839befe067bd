"""The memory-bandwidth roofline of a GPU search, run on the device machine by bench/gpu/run.sh.

    python3 -m bench.gpu bandwidth                      # device copy bandwidth, JSON
    python3 -m bench.gpu roofline RESULTS --model M.gguf --bandwidth B.json --out DIR

`roofline` reads every trial's result.json of a `search run` results folder and prints a Markdown
table with the memory-bandwidth roofline: one decode step reads every weight except the token
embedding (a single row of it), so ceiling steps/s = copy bandwidth / those bytes. KV-cache
reads are left out, so the ceiling is optimistic and the percentage conservative.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


def bandwidth() -> dict[str, Any]:
    import torch

    n = 1 << 28  # 1 GiB per buffer
    a = torch.empty(n, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        t = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    best = min(times)
    return {"device": torch.cuda.get_device_name(0), "bytes_s": 2 * n * 4 / best,
            "method": "torch copy_ of 1 GiB fp32, read+write bytes over the best of 20"}


def bytes_per_step(model: Path) -> tuple[int, int]:
    """(bytes one decode step reads, total tensor bytes) of a GGUF."""
    import gguf

    reader = gguf.GGUFReader(str(model))
    total = sum(int(t.n_bytes) for t in reader.tensors)
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    per_step = total
    if embd is not None:
        rows = int(embd.shape[-1]) if len(embd.shape) > 1 else 1
        per_step = total - int(embd.n_bytes) + int(embd.n_bytes) // max(rows, 1)
    return per_step, total


_FLAGS = ("flash_attn", "batch_size", "ubatch_size", "parallel", "cache_type_k", "cache_type_v")


def table(results: Path, model: Path, bw_file: Path, out: Path | None) -> str:
    bw = json.loads(bw_file.read_text())
    step_bytes, total = bytes_per_step(model)
    ceiling = bw["bytes_s"] / step_bytes
    rows: list[dict[str, Any]] = []
    for path in sorted(results.glob("**/trials/*/result.json")):
        rows.append(json.loads(path.read_text()))
    lines = [f"Device: {bw['device']}; copy bandwidth {bw['bytes_s'] / 1e12:.2f} TB/s ({bw['method']}).",
             f"Model: {model.name}, {total / 1e9:.2f} GB of tensors, {step_bytes / 1e9:.3f} GB read per decode "
             f"step -> roofline {ceiling:.0f} steps/s per stream.", "",
             "| trial | -fa | -b | -ub | -np | K | V | single tok/s | single decode tok/s | roofline % "
             "| 4 streams tok/s | TTFT p50 single (ms) | ready s | state |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def fmt(value: Any, digits: int = 0) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    for r in rows:
        m, p = r.get("metrics") or {}, r.get("params") or {}
        decode = m.get("single.decode_tok_s")
        pct = 100.0 * decode / ceiling if decode else None
        ttft = m.get("single.ttft_p50_s") or m.get("single.ttft_cold_p50_s")
        state = r.get("state", "?")
        if r.get("failure"):
            state += f" ({r['failure'].get('cause')})"
        lines.append("| " + " | ".join([str(r.get("number")), *(str(p.get(k, "-")) for k in _FLAGS),
                                        fmt(m.get("single.output_tok_s")), fmt(decode), fmt(pct, 1),
                                        fmt(m.get("four.output_tok_s")), fmt(ttft * 1e3 if ttft else None, 1),
                                        fmt(r.get("ready_s"), 1), state]) + " |")
    text = "\n".join(lines)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        keep = [{k: r.get(k) for k in ("number", "state", "params", "metrics", "startup", "command", "failure",
                                       "ready_s", "fingerprint", "placebo", "warnings")} for r in rows]
        (out / "results.json").write_text(json.dumps({"bandwidth": bw, "bytes_per_step": step_bytes,
                                                      "roofline_steps_s": ceiling, "trials": keep}, indent=1,
                                                     default=str))
        for r in rows:  # one CUDA startup log for tests/data (tensor-listing lines dropped)
            log = Path(r.get("log_path") or "")
            if r.get("state") == "complete" and log.exists():
                kept = [ln for ln in log.read_text(errors="replace").splitlines()
                        if "llama_model_loader: - " not in ln]
                (out / "llamacpp_cuda_ready.log").write_text("\n".join(kept) + "\n")
                break
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("bandwidth")
    t = sub.add_parser("roofline")
    t.add_argument("results", type=Path)
    t.add_argument("--model", type=Path, required=True)
    t.add_argument("--bandwidth", type=Path, required=True)
    t.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    if a.cmd == "bandwidth":
        print(json.dumps(bandwidth()))
    else:
        print(table(a.results, a.model, a.bandwidth, a.out))
    return 0

