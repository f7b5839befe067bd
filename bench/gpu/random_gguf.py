"""Write a random-weight llama-architecture GGUF (TinyLlama's shape by default: ~1.1B params, f16).

The text it writes is noise, but every decode step reads every weight, so throughput and the
memory-bandwidth roofline are real. The vocabulary is SentencePiece-style with byte fallback
(256 byte tokens) plus ChatML control tokens and filler pieces up to `--vocab`, so llama-server
can tokenize any text and apply a chat template.

    python3 -m bench.gpu gguf OUT.gguf                   # ~1.1B, 2.2 GB, ~30 s
    python3 -m bench.gpu gguf OUT.gguf --hidden 64 --layers 2 --ffn 128 --heads 4 --kv-heads 2
    python3 -m bench.gpu gguf OUT.gguf --hidden 4096 --layers 32 --ffn 14336 --kv-heads 8 --pool
                                     # Mistral-7B's shape: 7.24B params, 14.5 GB, written in seconds

--pool cuts every weight from one shared random buffer (256 MiB of f16) at a random offset instead
of drawing each anew: drawing 7B normals takes minutes, and the values do not change the speed of a
decode step (every weight is still read; the f16 kernels do not depend on the values).
"""

from __future__ import annotations

import argparse
import time

import gguf
import numpy as np

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def vocab(size: int) -> tuple[list[str], list[float], list[int]]:
    T = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL, T.CONTROL, T.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [T.BYTE] * 256
    words = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["\u2581"]
    i = 0
    while len(tokens) < size:  # distinct filler pieces so the vocab has the requested size
        tokens.append("\u2581" + words[i % len(words)] + str(i))
        types.append(T.NORMAL)
        i += 1
    scores = [0.0] * 5 + [0.0] * 256 + [-float(k) for k in range(len(tokens) - 261)]
    return tokens, scores, [int(t) for t in types]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.gpu gguf", description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=22)
    p.add_argument("--ffn", type=int, default=5632)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--ctx", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pool", action="store_true", help="cut weights from one shared random buffer (fast)")
    a = p.parse_args(argv)
    t0 = time.time()
    rng = np.random.default_rng(a.seed)
    head_dim = a.hidden // a.heads

    pool = (rng.standard_normal(1 << 27, dtype=np.float32) * 0.02).astype(np.float16) if a.pool else None

    def w(rows: int, cols: int) -> np.ndarray:  # numpy (rows, cols) = ggml ne [cols, rows]
        if pool is not None and rows * cols <= pool.size:
            off = int(rng.integers(0, pool.size - rows * cols + 1))
            return pool[off: off + rows * cols].reshape(rows, cols)  # a view: nothing copied until written
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    writer = gguf.GGUFWriter(a.out, "llama")
    writer.add_name("random-llama")
    writer.add_context_length(a.ctx)
    writer.add_embedding_length(a.hidden)
    writer.add_block_count(a.layers)
    writer.add_feed_forward_length(a.ffn)
    writer.add_head_count(a.heads)
    writer.add_head_count_kv(a.kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens, scores, types = vocab(a.vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(4)  # <|im_end|>
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)

    n_params = 0

    def add(name: str, array: np.ndarray) -> None:
        nonlocal n_params
        n_params += array.size
        writer.add_tensor(name, array)

    add("token_embd.weight", w(len(tokens), a.hidden))
    for i in range(a.layers):
        add(f"blk.{i}.attn_norm.weight", ones(a.hidden))
        add(f"blk.{i}.attn_q.weight", w(a.hidden, a.hidden))
        add(f"blk.{i}.attn_k.weight", w(a.kv_heads * head_dim, a.hidden))
        add(f"blk.{i}.attn_v.weight", w(a.kv_heads * head_dim, a.hidden))
        add(f"blk.{i}.attn_output.weight", w(a.hidden, a.hidden))
        add(f"blk.{i}.ffn_norm.weight", ones(a.hidden))
        add(f"blk.{i}.ffn_gate.weight", w(a.ffn, a.hidden))
        add(f"blk.{i}.ffn_up.weight", w(a.ffn, a.hidden))
        add(f"blk.{i}.ffn_down.weight", w(a.hidden, a.ffn))
    add("output_norm.weight", ones(a.hidden))
    add("output.weight", w(len(tokens), a.hidden))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {a.out}: {n_params / 1e9:.3f} B params in {time.time() - t0:.1f} s")

