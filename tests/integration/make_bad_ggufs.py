#!/usr/bin/env python3
"""Writes deliberately broken GGUF files for the CLI's bad-input tests (one per defect).

Usage: make_bad_ggufs.py OUTDIR VALID.gguf
Each file has exactly one defect; the CLI must answer each with one clear error line and a
non-zero exit. Written by hand with struct (no gguf package) so the defects are exact."""
import os
import struct
import sys

def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b

def kv_u32(k, v):
    return s(k) + struct.pack("<I", 4) + struct.pack("<I", v)

def kv_str(k, v):
    return s(k) + struct.pack("<I", 8) + s(v)

def tensor_info(name, dims, ttype, offset):
    return s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) \
        + struct.pack("<IQ", ttype, offset)

def gguf(kvs, infos, data, version=3):
    head = b"GGUF" + struct.pack("<IQQ", version, len(infos), len(kvs)) + b"".join(kvs) + b"".join(infos)
    pad = (-len(head)) % 32
    return head + b"\0" * pad + data

def set_u32(blob, key, value):
    """blob with its u32 metadata `key` set to value (patched in place: same length)."""
    k = s(key) + struct.pack("<I", 4)
    i = blob.index(k) + len(k)
    return blob[:i] + struct.pack("<I", value) + blob[i + 4:]

def set_f32(blob, key, value):
    """blob with its f32 metadata `key` set to value (patched in place: same length)."""
    k = s(key) + struct.pack("<I", 6)
    i = blob.index(k) + len(k)
    return blob[:i] + struct.pack("<f", value) + blob[i + 4:]

EPS = "llama.attention.layer_norm_rms_epsilon"

LLAMA = [kv_str("general.architecture", "llama"), kv_u32("llama.embedding_length", 64),
         kv_u32("llama.block_count", 1), kv_u32("llama.feed_forward_length", 128),
         kv_u32("llama.attention.head_count", 4)]

def main():
    out, valid = sys.argv[1], open(sys.argv[2], "rb").read()
    os.makedirs(out, exist_ok=True)
    files = {
        "truncated.gguf": valid[: len(valid) // 2],
        "bad_magic.gguf": b"GGML" + valid[4:],
        "version1.gguf": valid[:4] + struct.pack("<I", 1) + valid[8:],
        "version99.gguf": valid[:4] + struct.pack("<I", 99) + valid[8:],
        "unknown_type.gguf": gguf(LLAMA, [tensor_info("token_embd.weight", [64, 8], 77, 0)], b"\0" * 2048),
        "outside.gguf": gguf(LLAMA, [tensor_info("token_embd.weight", [64, 8], 0, 1 << 20)], b"\0" * 64),
        "absurd_dims.gguf": gguf(LLAMA, [tensor_info("token_embd.weight", [1 << 40, 1 << 40], 0, 0)], b"\0" * 64),
        "missing_arch.gguf": gguf(LLAMA[1:], [tensor_info("token_embd.weight", [64, 8], 0, 0)], b"\0" * 2048),
        "empty.gguf": b"",
        "nan_eps.gguf": set_f32(valid, EPS, float("nan")),
        "inf_eps.gguf": set_f32(valid, EPS, float("inf")),
        "negative_eps.gguf": set_f32(valid, EPS, -1e-5),
        # fewer blocks than the tensor table holds: loading the first ones ran garbage
        "short_block_count.gguf": set_u32(valid, "llama.block_count", 4),
    }
    for name, blob in files.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(blob)

if __name__ == "__main__":
    main()
