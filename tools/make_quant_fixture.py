#!/usr/bin/env python3
"""make_quant_fixture: writes tests/fixtures/quant_ref.bin, the independent cross-check of
qevict's dequantization (model/gguf_quant.c).

For each supported tensor type T the file holds two tensors:
  q.T    a few blocks of random data in T's encoding (random bytes; every fp16 scale field is
         a random *finite* fp16 bit pattern, so zeros, subnormals and large values occur),
  ref.T  F32: what the Python package `gguf` (gguf-py, llama.cpp's own reference code)
         dequantizes q.T to.
tests/unit/test_gguf.c dequantizes q.T with qevict and requires ref.T bit for bit.

Usage: pip install gguf numpy && python3 tools/make_quant_fixture.py [out.bin]
The output is deterministic for a given gguf-py version (fixed seed); it is ~35 KB. It is a
GGUF file named .bin because the repository's .gitignore ignores *.gguf (model files).
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

SEED = 20240611
ROWS = 2
# type -> blocks per row
TYPES = {
    T.F32: 96,
    T.F16: 512,
    T.BF16: 512,
    T.Q4_0: 6,
    T.Q4_1: 6,
    T.Q8_0: 6,
    T.Q4_K: 2,
    T.Q5_K: 2,
    T.Q6_K: 2,
}
# byte offsets of the fp16 scale fields inside one block
FP16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q8_0: [0],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}


def finite_fp16_bits(rng, n):
    """Random fp16 bit patterns with the inf/nan exponent (31) replaced by a random one."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32)
    exp = (bits >> 10) & 31
    new_exp = rng.integers(0, 31, size=n, dtype=np.uint32) << 10
    bits = np.where(exp == 31, (bits & ~np.uint32(31 << 10)) | new_exp, bits)
    return bits.astype(np.uint16)


def edge_bits16(rng, n, fp16):
    """Random 16-bit patterns plus the edge cases (zeros, subnormals, inf, nan, max)."""
    edges = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
             0x7E00, 0x7C01, 0x3C00, 0xBC00, 0x3555] if fp16 else \
            [0x0000, 0x8000, 0x0001, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0,
             0x7F81, 0x3F80, 0xBF80]
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    bits[: len(edges)] = edges
    return bits


def make_quant(rng, qtype, n_blocks):
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint16).astype(np.uint8)
    for off in FP16_FIELDS[qtype]:
        raw[:, off:off + 2] = finite_fp16_bits(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw


def make_pair(rng, qtype):
    """Returns (data array to store, raw_dtype or None, F32 reference of shape [ROWS, cols])."""
    block, size = GGML_QUANT_SIZES[qtype]
    cols = block * TYPES[qtype]
    if qtype == T.F32:
        x = rng.standard_normal((ROWS, cols)).astype(np.float32)
        return x, None, x.copy()
    if qtype in (T.F16, T.BF16):
        bits = edge_bits16(rng, ROWS * cols, qtype == T.F16).reshape(ROWS, cols)
        if qtype == T.F16:
            return bits.view(np.float16), None, gguf.quants.dequantize(bits.view(np.uint8), qtype)
        raw = bits.view(np.uint8)
        return raw, qtype, gguf.quants.dequantize(raw, qtype)
    raw = make_quant(rng, qtype, ROWS * TYPES[qtype]).reshape(ROWS, -1)
    return raw, qtype, gguf.quants.dequantize(raw, qtype)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/quant_ref.bin"
    rng = np.random.default_rng(SEED)
    w = gguf.GGUFWriter(out, "qevict-fixture")
    w.add_string("qevict.fixture.generator", "tools/make_quant_fixture.py (gguf-py dequantize)")
    for qtype in TYPES:
        data, raw_dtype, ref = make_pair(rng, qtype)
        cols = GGML_QUANT_SIZES[qtype][0] * TYPES[qtype]
        assert ref.dtype == np.float32 and ref.shape == (ROWS, cols)
        w.add_tensor("q." + qtype.name, data, raw_dtype=raw_dtype)
        w.add_tensor("ref." + qtype.name, np.ascontiguousarray(ref))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = gguf.GGUFReader(out)  # reads back with gguf-py as a sanity check
    print(f"{out}: {len(r.tensors)} tensors")


if __name__ == "__main__":
    main()
