#!/usr/bin/env python3
"""Generate tests/fixtures/smollm2_ref.json: reference logits for SmolLM2-135M-Instruct.

Run on demand (not in CI). It needs torch, transformers, accelerate and gguf:

    pip install torch transformers accelerate gguf sentencepiece
    deploy/fetch-model.sh                # puts the GGUF in ~/.cache/qevict/models/
    python3 tools/make_reference.py      # writes tests/fixtures/smollm2_ref.json

Hugging Face transformers loads the GGUF (Q4_1 / Q8_0 blocks dequantized to fp32
by the `gguf` package), runs one forward pass over a fixed prompt on the CPU in
fp32, and records, for each of the first 64 positions, statistics of the full
logit vector plus the logits at a fixed subset of vocabulary ids. It also records
32 greedy new tokens after the full prompt.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
from pathlib import Path

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

# Plain text (no chat template): a short paragraph followed by a question.
PROMPT = (
    "The lighthouse on Gull Point was built in 1874 from granite quarried on the "
    "island itself. For more than a century its keepers climbed one hundred and "
    "twelve steps every evening to light the lamp, which could be seen from twenty "
    "miles out at sea. In 1962 the light was automated, and the last keeper, a "
    "quiet man named Thomas Reed, moved to the mainland, where he spent his "
    "remaining years painting ships.\n"
    "Question: How many steps did the keepers climb to light the lamp?\n"
    "Answer:"
)

N_POS = 64          # positions recorded
N_TOP = 64          # per-position top-k ids
N_SHARED = 448      # ids shared by all positions
SHARED_SEED = 20240601
N_GREEDY = 32


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def default_model_path() -> Path:
    cache = os.environ.get("QEVICT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "qevict")
    return Path(cache) / "models" / MODEL_FILE


def gguf_add_bos(path: Path) -> bool:
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    field = reader.fields.get("tokenizer.ggml.add_bos_token")
    return bool(field.contents()) if field is not None else False


def main() -> int:
    repo = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=default_model_path(),
                    help="path to %s (default: $QEVICT_CACHE/models/...)" % MODEL_FILE)
    ap.add_argument("--out", type=Path, default=repo / "tests" / "fixtures" / "smollm2_ref.json")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    args = ap.parse_args()

    model_path: Path = args.model.resolve()
    if not model_path.is_file():
        print(f"make_reference: {model_path} not found; run deploy/fetch-model.sh first", file=sys.stderr)
        return 1
    digest = sha256_file(model_path)
    if digest != MODEL_SHA256:
        print(f"make_reference: sha256 mismatch for {model_path}: {digest} != {MODEL_SHA256}", file=sys.stderr)
        return 1

    import gguf
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    add_bos = gguf_add_bos(model_path)
    tok = AutoTokenizer.from_pretrained(str(model_path.parent), gguf_file=model_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(model_path.parent), gguf_file=model_path.name, dtype=torch.float32
    )
    model.eval()
    # The GGUF has no output.weight: transformers must tie lm_head to token_embd.
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.lm_head.weight.dtype == torch.float32
    n_vocab = int(model.config.vocab_size)

    # Tokenize exactly as the GGUF says: the ids are the BPE of the text, with BOS only if add_bos.
    ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    if add_bos:
        ids = [int(tok.bos_token_id)] + ids
    ids = [int(i) for i in ids]
    if len(ids) < N_POS + 8:
        print(f"make_reference: prompt is only {len(ids)} tokens", file=sys.stderr)
        return 1
    if tok.decode(ids[1:] if add_bos else ids) != PROMPT:
        print("make_reference: tokenizer round trip does not reproduce the prompt", file=sys.stderr)
        return 1

    input_ids = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits[0]
    assert logits.dtype == torch.float32 and logits.shape == (len(ids), n_vocab), logits.shape

    rng = random.Random(SHARED_SEED)
    shared_ids = sorted(rng.sample(range(n_vocab), N_SHARED))
    shared_t = torch.tensor(shared_ids, dtype=torch.long)

    positions = []
    for p in range(N_POS):
        row = logits[p]
        top_vals, top_idx = torch.topk(row, N_TOP)
        positions.append({
            "pos": p,
            "norm": float(torch.linalg.vector_norm(row.double())),
            "max": float(row.max()),
            "argmax": int(row.argmax()),
            "top_ids": [int(i) for i in top_idx],
            "top_logits": [float(v) for v in top_vals],
            "shared_logits": [float(v) for v in row[shared_t]],
        })

    # Greedy continuation after the full prompt. EOS is not allowed to stop it early, so
    # there are always N_GREEDY ids (pure argmax at each step, with transformers' KV cache).
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=N_GREEDY,
            min_new_tokens=0,
            do_sample=False,
            num_beams=1,
            eos_token_id=None,
            pad_token_id=int(tok.pad_token_id if tok.pad_token_id is not None else 0),
            output_scores=True,
            return_dict_in_generate=True,
        )
    greedy_ids = [int(i) for i in out.sequences[0, len(ids):]]
    # top1 - top2 logit gap at each greedy step: a small gap means an engine with quantized
    # kernels may legitimately pick the runner-up there.
    greedy_margins = []
    for step, sc in enumerate(out.scores):
        top2 = torch.topk(sc[0].float(), 2).values
        assert int(sc[0].argmax()) == greedy_ids[step]
        greedy_margins.append(float(top2[0] - top2[1]))
    assert len(greedy_ids) == N_GREEDY, len(greedy_ids)
    # Cross-check: the first greedy token is the argmax of the last prompt position.
    assert greedy_ids[0] == int(logits[-1].argmax()), "generate() disagrees with the forward pass"

    fixture = {
        "description": "SmolLM2-135M-Instruct Q4_1 GGUF, logits from Hugging Face transformers "
                       "(torch CPU fp32, weights dequantized by the gguf package). Generated by "
                       "tools/make_reference.py; do not edit by hand.",
        "model": {"file": MODEL_FILE, "sha256": MODEL_SHA256},
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gguf": _dist_version("gguf", gguf),
        },
        "add_bos": add_bos,
        "tied_embeddings": tied,
        "prompt": PROMPT,
        "n_prompt_tokens": len(ids),
        "prompt_ids": ids,
        "ids": ids[:N_POS],
        "n_vocab": n_vocab,
        "n_positions": N_POS,
        "n_top": N_TOP,
        "shared_seed": SHARED_SEED,
        "shared_ids": shared_ids,
        "positions": positions,
        "greedy_from": "full prompt (prompt_ids)",
        "greedy_ids": greedy_ids,
        "greedy_text": tok.decode(greedy_ids),
        "greedy_margins": greedy_margins,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        f.write("\n")
    os.replace(tmp, args.out)

    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    print(f"prompt tokens: {len(ids)}  add_bos: {add_bos}")
    print(f"argmax[0:8]: {[pp['argmax'] for pp in positions[:8]]}")
    print(f"greedy: {greedy_ids}")
    print(f"greedy text: {tok.decode(greedy_ids)!r}")
    print(f"greedy min margin: {min(greedy_margins):.4g} at step {greedy_margins.index(min(greedy_margins))}")
    print(f"tied embeddings: {tied}")
    return 0


def _dist_version(dist: str, module) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # pragma: no cover
        return str(getattr(module, "__version__", "unknown"))


if __name__ == "__main__":
    sys.exit(main())
