"""python -m bench.gpu {gguf,bandwidth,roofline}: the GPU runs' helpers (bench/gpu/run.sh calls them).

    python3 -m bench.gpu gguf OUT.gguf [--hidden ... --pool]   # a random-weight llama GGUF (random_gguf.py)
    python3 -m bench.gpu bandwidth                             # device copy bandwidth, JSON (roofline.py)
    python3 -m bench.gpu roofline RESULTS --model M.gguf --bandwidth B.json --out DIR
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if argv[:1] == ["gguf"]:
        from bench.gpu import random_gguf  # gguf and numpy: only where a model is written

        random_gguf.main(argv[1:])
        return 0
    from bench.gpu import roofline

    return roofline.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
