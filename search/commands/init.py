"""`search init ENGINE MODEL_PATH`: write a commented space for that engine and the user's model, so a
first search needs no YAML written by hand. The file loads as written (a test checks every engine) and
names the JSON Schema for editors."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from search.exit_codes import Exit
from search.shipped import shipped_dir
from search.space.space import load_space
from search.terminal import err, safe

HEADER = """\
# yaml-language-server: $schema={schema}
# A search space written by `search init {engine} {model_path}`. Edit freely; every key is in
# docs/search.md, the engines in docs/engines.md. First see what it would start, then run it:
#   search run {file} --dry-run
#   search run {file}
name: {name}
description: {what} for {model}; aggregate tok/s of four streams, quality-gated
"""

COMMON = """
models:
  - name: {model}
    path: "{model_path}"

# One measured run per workload after a warm-up it agrees with; the confirmation at the end re-measures
# the best configs beside the default with fresh starts, which is what decides.
measure:
  repeats: 1
  warmup: true
  request_timeout_s: 300

# Every stream generates exactly max_tokens; the throughput is the steady window in which all decode.
workloads:
  - {{name: single, streams: [qa], max_tokens: 128}}
  - {{name: four_streams, streams: [qa, code, json, math], max_tokens: 128}}

# Answer-quality spot checks on every config: a faster config that answers worse is no winner.
quality:
  suite: smoke
  min_score: 0.5

objectives:
  - {{metric: four_streams.output_tok_s, direction: maximize}}

constraints:
  - "errors == 0"

budget:
  trials: 20  # trial 0 is every param at its default: the baseline the others are compared with
"""

ENGINES = {
    "vllm": ("vLLM knobs", """
engines:
  vllm:
    dialect: vllm
    launcher: process           # or `launcher: docker` with `image: vllm/vllm-openai:TAG`, `gpus: all`, volumes
    command: ["vllm", "serve"]  # flagsearch adds the model, host, port and the sampled flags
    args:                       # fixed flags of every trial (--max-model-len 8192)
      max_model_len: 8192
    ready_timeout_s: 1800       # a big model's start takes minutes; a start past this is a failed trial

# What the search varies (each name is the flag: max_num_seqs -> --max-num-seqs); `default` is trial 0.
params:
  max_num_seqs: {type: categorical, choices: [64, 128, 256], default: 128}
  max_num_batched_tokens: {type: categorical, choices: [2048, 8192, 16384], default: 8192}
  gpu_memory_utilization: {type: categorical, choices: [0.85, 0.9], default: 0.9}
  enable_prefix_caching: {type: categorical, choices: [true, false], default: true}
  kv_cache_dtype: {type: categorical, choices: [auto, fp8], default: auto}
"""),
    "sglang": ("SGLang knobs", """
engines:
  sglang:
    dialect: sglang
    launcher: process           # or `launcher: docker` with `image: lmsysorg/sglang:TAG`, `gpus: all`, volumes
    command: ["python3", "-m", "sglang.launch_server"]
    args:
      context_length: 8192
    ready_timeout_s: 1800

# vLLM-style names map to SGLang's flags (harness/engines/sglang.py): max_num_seqs -> --max-running-requests,
# max_num_batched_tokens -> --chunked-prefill-size, gpu_memory_utilization -> --mem-fraction-static.
params:
  max_num_seqs: {type: categorical, choices: [64, 128, 256], default: 128}
  max_num_batched_tokens: {type: categorical, choices: [2048, 8192], default: 8192}
  gpu_memory_utilization: {type: categorical, choices: [0.85, 0.9], default: 0.85}
  schedule_policy: {type: categorical, choices: [fcfs, lpm], default: fcfs}
"""),
    "llamacpp": ("llama-server knobs", """
engines:
  llamacpp:
    dialect: llamacpp
    launcher: process
    command: ["llama-server"]   # a path to your build's llama-server, or on PATH
    args:
      ctx_size: 8192            # split over the --parallel slots
    ready_timeout_s: 600

params:
  threads: {{type: categorical, choices: {threads}, default: {threads_default}}}
  parallel: {{type: categorical, choices: [4, 1, 8], default: 4}}
  flash_attn: {{type: categorical, choices: ["on", "off"], default: "on"}}
  cache_type_k: {{type: categorical, choices: [f16, q8_0], default: f16}}
  # A quantized V cache needs flash attention: llama-server exits otherwise.
  cache_type_v: {{type: categorical, choices: [f16, q8_0], default: f16, when: {{flash_attn: "on"}}}}
  batch_size: {{type: categorical, choices: [2048, 512], default: 2048}}
  ubatch_size: {{type: categorical, choices: [512, 128], default: 512}}
"""),
    "transformers_serve": ("transformers serve knobs", """
engines:
  transformers_serve:
    dialect: transformers_serve
    launcher: process
    command: ["transformers", "serve"]
    ready_timeout_s: 600

params:
  dtype: {type: categorical, choices: [bfloat16, float32], default: bfloat16}
  attn_implementation: {type: categorical, choices: [sdpa, eager], default: sdpa}
"""),
    "command": ("knobs of an OpenAI-compatible server", """
engines:
  server:
    dialect: command
    launcher: process
    # Any OpenAI-compatible server: {model}, {port} and {host} are filled in for each trial.
    command: ["my-server", "--model", "{model}", "--host", "{host}", "--port", "{port}"]
    flag_map:                   # each param's flag
      batch_size: --batch-size
    ready_timeout_s: 600

params:
  batch_size: {type: categorical, choices: [8, 16, 32], default: 16}
"""),
}


def render(engine: str, model_path: str, name: str, file: str, schema: str) -> str:
    what, body = ENGINES[engine]
    model = re.sub(r"[^A-Za-z0-9_.\-]+", "-", Path(model_path.rstrip("/")).name.removesuffix(".gguf")) or "model"
    cores = os.cpu_count() or 2
    threads = sorted({cores, max(1, cores // 2)}, reverse=True)
    fields = {"engine": engine, "model_path": model_path, "model": model, "name": name, "file": file,
              "schema": schema, "what": what, "threads": f"[{', '.join(map(str, threads))}]",
              "threads_default": threads[0]}
    text = HEADER.format(**fields)
    text += body.format(**fields) if "{{" in body else body
    return text + COMMON.format(**fields)


def cmd_init(args: argparse.Namespace) -> int:
    model_path = str(Path(args.model_path).expanduser().resolve()) if Path(args.model_path).exists() \
        else args.model_path
    out = Path(args.out or f"{args.name or args.engine}.yaml")
    if out.exists() and not args.force:
        raise ValueError(f"{out} exists: pass --force to overwrite it, or -o ANOTHER.yaml")
    name = args.name or re.sub(r"[^A-Za-z0-9_.\-]+", "-", out.stem)
    schema = str(shipped_dir() / "space.schema.json")
    out.write_text(render(args.engine, model_path, name, str(out), schema))
    load_space(out)  # what was written loads: a template that does not is a bug, said here
    if not Path(args.model_path).exists():
        err.print(f"[yellow]warning[/]: {safe(args.model_path)} does not exist here (fine for an image's path)")
    err.print(f"wrote {safe(out)}: try `search run {safe(out)} --dry-run`")
    return Exit.PASS


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("init", help="write a commented space for an engine and your model (then: search run)")
    p.add_argument("engine", choices=sorted(ENGINES), help="the engine dialect")
    p.add_argument("model_path", help="the checkpoint: a Hugging Face folder, a .gguf file, or the path an image sees")
    p.add_argument("-o", "--out", metavar="FILE", help="the space file to write (default ENGINE.yaml)")
    p.add_argument("--name", help="the space's (and the study's) name (default: the file's name)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(func=cmd_init)
