"""The old name of harness/flagsearch_home.py, kept only until its last importers switch (files other
sessions are editing: harness/build_cache.py and the tests test_ab_e2e, test_bisect_e2e,
test_nightly_e2e, test_faults, test_window_e2e); delete it then."""

from harness.flagsearch_home import (
    LLAMA_CPP_VERSION,
    VLLM_VERSION,
    home,
    llama_server,
    smollm2_gguf,
    smollm2_hf,
    vllm_python,
)

__all__ = ["LLAMA_CPP_VERSION", "VLLM_VERSION", "home", "llama_server", "smollm2_gguf", "smollm2_hf", "vllm_python"]
