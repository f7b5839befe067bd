"""Write a deliberately damaged copy of a model: one tensor zeroed or scaled.

For quality tests: a config running the copy must be caught by the quality checks. Two formats:
  * GGUF (llama.cpp): the file is copied, then the tensor's bytes are changed in place through the
    `gguf` package's memory map. F32/F16/BF16 tensors are scaled directly; Q4_0/Q4_1/Q8_0 blocks
    have their fp16 scale (and Q4_1's min) multiplied, which scales every weight of the block.
  * Hugging Face folder with safetensors (vLLM): every file is linked except the safetensors file
    holding the tensor, which is rewritten with the tensor changed (bf16/f16/f32, plain numpy).

Usage:
  python scripts/damage_model.py SRC DST --tensor blk.10.ffn_down.weight --zero
  python scripts/damage_model.py SRC_DIR DST_DIR --tensor model.layers.10.mlp.down_proj.weight --scale 8
  python scripts/damage_model.py SRC --list        # tensor names, types and shapes
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

# GGUF block layouts whose leading fp16 fields scale the whole block: type -> (block bytes, fp16 fields)
_BLOCK_SCALES = {"Q4_0": (18, 1), "Q8_0": (34, 1), "Q4_1": (20, 2), "Q5_0": (22, 1), "Q5_1": (24, 2)}


class DamageError(Exception):
    pass


# ---- GGUF --------------------------------------------------------------------------------------

def gguf_tensors(path: Path) -> list[tuple[str, str, tuple[int, ...]]]:
    from gguf import GGUFReader

    reader = GGUFReader(path, "r")
    return [(t.name, t.tensor_type.name, tuple(int(x) for x in t.shape)) for t in reader.tensors]


def damage_gguf(src: Path, dst: Path, tensor: str, scale: float) -> str:
    """Copy src to dst and multiply one tensor by `scale` (0 zeroes it). Returns the tensor type."""
    from gguf import GGUFReader

    shutil.copyfile(src, dst)
    reader = GGUFReader(dst, "r+")
    found = [t for t in reader.tensors if t.name == tensor]
    if not found:
        dst.unlink()
        raise DamageError(f"no tensor {tensor!r} in {src} (see --list)")
    t = found[0]
    kind = t.tensor_type.name
    data = t.data
    if scale == 0.0:
        data[...] = 0
    elif kind in ("F32", "F16"):
        data[...] = (data.astype(np.float32) * scale).astype(data.dtype)
    elif kind == "BF16":
        data[...] = _bf16_scale(data.view(np.uint16), scale).view(data.dtype)
    elif kind in _BLOCK_SCALES:
        size, fields = _BLOCK_SCALES[kind]
        raw = data.reshape(-1).view(np.uint8).reshape(-1, size)
        head = np.ascontiguousarray(raw[:, :2 * fields]).view(np.float16)
        raw[:, :2 * fields] = (head.astype(np.float32) * scale).astype(np.float16).view(np.uint8)
    else:
        dst.unlink()
        raise DamageError(f"cannot scale a {kind} tensor; use --zero or a F32/F16/Q4_0/Q4_1/Q8_0 tensor")
    reader.data.flush()
    return kind


def _bf16_scale(bits: np.ndarray, scale: float) -> np.ndarray:
    as_f32 = (bits.astype(np.uint32) << 16).view(np.float32) * np.float32(scale)
    return (as_f32.view(np.uint32) >> 16).astype(np.uint16)


# ---- safetensors -------------------------------------------------------------------------------

def _read_header(path: Path) -> tuple[int, dict]:
    with path.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return n, json.loads(fh.read(n))


def safetensors_tensors(folder: Path) -> list[tuple[str, str, tuple[int, ...]]]:
    out = []
    for f in sorted(folder.glob("*.safetensors")):
        _, header = _read_header(f)
        out += [(k, v["dtype"], tuple(v["shape"])) for k, v in header.items() if k != "__metadata__"]
    return out


def damage_safetensors(src: Path, dst: Path, tensor: str, scale: float) -> str:
    """Link every file of the folder into dst, rewriting the safetensors file that holds `tensor`."""
    holder = None
    for f in sorted(src.glob("*.safetensors")):
        if tensor in _read_header(f)[1]:
            holder = f
    if holder is None:
        raise DamageError(f"no tensor {tensor!r} in {src} (see --list)")
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        target = dst / f.name
        if f == holder or target.exists():
            continue
        if f.is_file():
            os.link(f, target) if _same_device(f, dst) else shutil.copy2(f, target)
    n, header = _read_header(holder)
    meta = header[tensor]
    begin, end = meta["data_offsets"]
    buf = bytearray(holder.read_bytes())
    base = 8 + n
    chunk = np.frombuffer(buf, dtype=np.uint8, count=end - begin, offset=base + begin).copy()
    dtype = meta["dtype"]
    if scale == 0.0:
        chunk[:] = 0
    elif dtype == "BF16":
        chunk = _bf16_scale(chunk.view(np.uint16), scale).view(np.uint8)
    elif dtype in ("F16", "F32"):
        np_type = np.float16 if dtype == "F16" else np.float32
        chunk = (chunk.view(np_type).astype(np.float32) * scale).astype(np_type).view(np.uint8)
    else:
        raise DamageError(f"cannot scale a {dtype} tensor; use --zero")
    buf[base + begin:base + end] = chunk.tobytes()
    out = dst / holder.name
    out.write_bytes(bytes(buf))
    return dtype


def _same_device(a: Path, b: Path) -> bool:
    return a.stat().st_dev == b.stat().st_dev


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="a .gguf file or a Hugging Face folder with safetensors")
    ap.add_argument("dst", type=Path, nargs="?", help="where to write the damaged copy")
    ap.add_argument("--tensor", help="the tensor to damage (see --list)")
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--zero", action="store_true", help="set every weight of the tensor to 0")
    how.add_argument("--scale", type=float, help="multiply the tensor by this factor")
    ap.add_argument("--list", action="store_true", help="list tensors and exit")
    args = ap.parse_args(argv)
    is_gguf = args.src.suffix == ".gguf"
    try:
        if not args.src.exists():
            raise DamageError(f"{args.src} does not exist")
        if args.list:
            for name, kind, shape in (gguf_tensors(args.src) if is_gguf else safetensors_tensors(args.src)):
                print(f"{name}\t{kind}\t{list(shape)}")
            return 0
        if not args.dst or not args.tensor or not (args.zero or args.scale is not None):
            raise DamageError("give DST, --tensor and one of --zero / --scale")
        if args.dst.resolve() == args.src.resolve():
            raise DamageError("DST must differ from SRC (the source model is never modified)")
        factor = 0.0 if args.zero else float(args.scale)
        kind = (damage_gguf if is_gguf else damage_safetensors)(args.src, args.dst, args.tensor, factor)
    except (DamageError, OSError, ValueError) as exc:
        print(f"damage_model: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.dst}: {args.tensor} ({kind}) {'zeroed' if factor == 0 else f'scaled by {factor:g}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
