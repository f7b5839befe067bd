"""Every configuration the source documents measured or report can be rebuilt from the flagship space
(spaces/qwen122b.yaml), launches as the documents ran it, and the known-good ones are queued: a
dry run shows them first, in the order a real run takes them."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pytest

from search.space.space import load_space
from search.space.values import check_value
from search.store.summary import load_view
from search.study.dryrun import config_with, dry_run, launch_of, planned_trials
from search.study.study import StudyRunner
from tests.conftest import Quiet

QWEN = Path(__file__).resolve().parents[2] / "spaces" / "qwen122b.yaml"
_LEFT_OUT = {"max_num_seqs": None, "max_num_batched_tokens": None, "enable_prefix_caching": None}


@dataclass(frozen=True)
class Documented:
    what: str  # the result as the documents report it
    engine: str
    model: str
    params: dict[str, Any]
    flags: tuple[str, ...] = ()  # words the launch must hold, in this order
    absent: tuple[str, ...] = ()  # words it must not hold
    queued: bool = False
    mtp: int | None = field(default=None)  # num_speculative_tokens in --speculative-config


RECIPE = {"attention_backend": "FLASHINFER", "kv_cache_dtype": "auto", "gpu_memory_utilization": 0.9, **_LEFT_OUT}
DOCUMENTED = [
    Documented("51 tok/s: INT4-AutoRound recipe v2 (hybrid INT4+FP8, INT8 LM head image, MTP on FlashInfer)",
               "vllm_albond", "hybrid-int4-fp8", {**RECIPE, "max_model_len": 262144, "num_speculative_tokens": 2},
               ("--max-model-len", "262144", "--gpu-memory-utilization", "0.9", "--attention-backend", "FLASHINFER",
                "--kv-cache-dtype", "auto"),  # auto: the engine's default, as the recipe left it
               ("--entrypoint", "--max-num-seqs", "--enable-prefix-caching", "--max-num-batched-tokens"), True, 2),
    Documented("38.4 tok/s: hybrid INT4+FP8 + MTP-1", "vllm_albond_hybrid", "hybrid-int4-fp8",
               {**RECIPE, "max_model_len": 32768, "num_speculative_tokens": 1},
               ("--max-model-len", "32768", "--attention-backend", "FLASHINFER"), ("--entrypoint",), True, 1),
    Documented("39 tok/s: the recipe's v2-tq, its own TurboQuant KV cache (not vLLM's turboquant_*)",
               "vllm_albond_tq", "hybrid-int4-fp8",
               {"max_model_len": 262144, "gpu_memory_utilization": 0.9, "num_speculative_tokens": 2, **_LEFT_OUT},
               ("--max-model-len", "262144", "--gpu-memory-utilization", "0.9", "--kv-cache-dtype", "turboquant35",
                "--enable-turboquant", "--turboquant-metadata-path"),
               ("--entrypoint", "--attention-backend", "--max-num-seqs"), False, 2),
    Documented("36.5 tok/s: Intel INT4 AutoRound + MTP-1 alone", "vllm_albond_hybrid", "intel-int4-autoround",
               {**RECIPE, "max_model_len": 32768, "num_speculative_tokens": 1}, (), ("--entrypoint",), True, 1),
    Documented("30.8 tok/s: hybrid INT4+FP8, no MTP", "vllm_albond_hybrid", "hybrid-int4-fp8",
               {**RECIPE, "max_model_len": 32768, "num_speculative_tokens": 0}, (), ("--speculative-config",)),
    Documented("28.3 tok/s: Intel INT4 AutoRound + FlashInfer", "vllm_albond_hybrid", "intel-int4-autoround",
               {**RECIPE, "max_model_len": 32768, "num_speculative_tokens": 0}, (), ("--speculative-config",)),
    Documented("36.5 tok/s: Atlas, abliterated NVFP4, MTP K=2", "atlas", "abliterated-nvfp4",
               {"atlas_max_prefill_tokens": 2048, "atlas_max_batch_size": 1, "atlas_gpu_memory_utilization": 0.99,
                "atlas_max_seq_len": 4096, "atlas_speculative": True, "atlas_num_drafts": 1},
               ("--max-prefill-tokens", "2048", "--max-batch-size", "1", "--gpu-memory-utilization", "0.99",
                "--max-seq-len", "4096", "--speculative", "--num-drafts", "1"), ("--entrypoint",), True),
    Documented("33.9 tok/s: Atlas without MTP", "atlas", "abliterated-nvfp4",
               {"atlas_max_seq_len": 4096, "atlas_speculative": False}, ("--max-seq-len", "4096"),
               ("--speculative", "--num-drafts")),
    Documented("24-31 tok/s, 63.9 for 4 streams: Sehyo NVFP4 + MTP-2, community image (the default)",
               "vllm_spark", "sehyo-nvfp4", {"max_model_len": 131072, "max_num_seqs": 4, "num_speculative_tokens": 2,
                                             "max_num_batched_tokens": 8192, "enable_prefix_caching": True},
               ("--entrypoint", "vllm", "--max-model-len", "131072", "--enable-prefix-caching"), (), False, 2),
    Documented("'32K default': 32768 context, 4096 batched tokens, no prefix caching", "vllm_spark", "sehyo-nvfp4",
               {"max_model_len": 32768, "max_num_batched_tokens": 4096, "enable_prefix_caching": False},
               ("--max-num-batched-tokens", "4096", "--no-enable-prefix-caching")),
    Documented("MTP-3, the documents' next experiment", "vllm_spark", "sehyo-nvfp4",
               {"num_speculative_tokens": 3}, mtp=3),
    Documented("17 tok/s: abliterated NVFP4 under vLLM", "vllm", "abliterated-nvfp4",
               {"num_speculative_tokens": 0}, (), ("--speculative-config",)),
    Documented("15.2 tok/s: the official recipe's MTP-6 (slower: to learn to avoid)", "vllm", "abliterated-nvfp4",
               {"num_speculative_tokens": 6}, mtp=6),
    Documented("the vision-tower fix: --mm-encoder-attn-backend TORCH_SDPA", "vllm", "abliterated-nvfp4",
               {"mm_encoder_attn_backend": "TORCH_SDPA"}, ("--mm-encoder-attn-backend", "TORCH_SDPA")),
    Documented("16.6 tok/s: RedHat NVFP4 on vLLM 0.19.1", "vllm", "redhat-nvfp4", {}),
    Documented("14 tok/s: NVFP4 with Marlin forced", "vllm", "sehyo-nvfp4", {"moe_backend": "marlin"},
               ("--moe-backend", "marlin")),
    Documented("SGLang with MTP (NEXTN) on a checkpoint with MTP weights", "sglang", "sehyo-nvfp4",
               {"num_speculative_tokens": 2}, ("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2",
                                               "--speculative-eagle-topk", "1"), ("--speculative-num-draft-tokens",)),
    Documented("SGLang with MTP 0: no speculation at all", "sglang", "sehyo-nvfp4", {"num_speculative_tokens": 0}, (),
               ("--speculative-algorithm", "--speculative-num-steps", "--speculative-eagle-topk",
                "--speculative-num-draft-tokens")),
    Documented("SGLang on txn545 (states SGLang support; no MTP weights)", "sglang", "txn545-nvfp4", {}, (),
               ("--speculative-algorithm",)),
]


def _in_order(words: list[str], wanted: tuple[str, ...]) -> bool:
    """`wanted` as consecutive pairs/switches somewhere in `words` (a flag and its value adjacent)."""
    i = 0
    while i < len(wanted):
        word = wanted[i]
        if word not in words:
            return False
        nxt = wanted[i + 1] if i + 1 < len(wanted) and not wanted[i + 1].startswith("-") else None
        if nxt is not None:
            if not any(words[j] == word and j + 1 < len(words) and words[j + 1] == nxt for j in range(len(words))):
                return False
            i += 2
        else:
            i += 1
    return True


@pytest.mark.parametrize("doc", DOCUMENTED, ids=lambda d: d.what[:40])
def test_every_documented_config_is_reachable_and_launches_as_documented(doc: Documented) -> None:
    space = load_space(QWEN)
    for name, value in doc.params.items():  # a value the sampler can draw, not only a FixedTrial's
        assert check_value(space.m.params[name], value) is None, (name, value)
    config = config_with(space, {"engine": doc.engine, "model": doc.model, **doc.params})
    assert (config.engine, config.model) == (doc.engine, doc.model)
    assert {k: config.values[k] for k in doc.params} == doc.params, "a param is inactive for this engine/model"
    launch = launch_of(space, config)
    assert launch.feasible, launch.fit
    words = shlex.split(launch.command)
    assert _in_order(words, doc.flags), (doc.flags, launch.command)
    for word in doc.absent:
        assert word not in words, (word, launch.command)
    if doc.mtp is not None:
        spec = json.loads(words[words.index("--speculative-config") + 1])
        assert spec == {"method": "mtp", "num_speculative_tokens": doc.mtp}
    image = space.m.engines[doc.engine].image
    assert image in words  # every engine runs its published or locally built image


def test_the_known_good_configs_are_queued_and_run_first() -> None:
    space = load_space(QWEN)
    queued = [d for d in DOCUMENTED if d.queued]
    labels = [label for label, _ in space.queued_configs()]
    assert len(labels) == len(queued)
    planned = planned_trials(space, 1 + len(queued) + 2)
    assert planned[0][0] == "default"
    assert space.default_config().items() <= planned[0][1].config.as_params().items()
    for (origin, launch), doc, label in zip(planned[1:], queued, labels, strict=False):
        assert origin == f"queued by the space: {label}"
        assert (launch.config.engine, launch.config.model) == (doc.engine, doc.model)
        assert {k: launch.config.values[k] for k in doc.params} == doc.params
    assert all(not origin.startswith("queued") for origin, _ in planned[1 + len(queued):])
    text = dry_run(space, 1 + len(queued))
    headers = [ln for ln in text if ln.startswith("# trial ")]
    assert [h.split(": ")[-1] for h in headers[1:]] == [f"{d.engine} / {d.model}" for d in queued]
    assert all("queued by the space: " in h for h in headers[1:])


def test_a_real_study_takes_the_queue_in_the_same_order(tmp_path: Path) -> None:
    """The runner enqueues the default and the space's queue; Optuna hands them out in that order."""
    space = load_space(QWEN)
    runner = StudyRunner(space, f"sqlite:///{tmp_path / 'study.db'}", "q", tmp_path, Quiet())
    waiting = runner.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    assert [t.system_attrs["fixed_params"] for t in waiting] == \
        [space.default_config()] + [params for _, params in space.queued_configs()]
    runner.session.close()
    assert load_view(runner.study) is not None
