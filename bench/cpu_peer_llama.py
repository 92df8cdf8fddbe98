#!/usr/bin/env python3
"""cpu_peer_llama: llama.cpp's CPU decode on a GGUF, through the llama-cpp-python package (PyPI;
it builds llama.cpp from its sources at install). Greedy, batch 1: the prompt evaluated once,
then N single-token steps, each the argmax of the last logits. Prints one JSON object.
usage: cpu_peer_llama.py MODEL PROMPT N THREADS"""
import json
import sys
import time

import numpy as np
from llama_cpp import Llama, __version__

model, prompt, n, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
llm = Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=2048,
            n_batch=512, verbose=False)
ids = llm.tokenize(prompt.encode(), add_bos=True)
t0 = time.perf_counter()
llm.eval(ids)
t1 = time.perf_counter()
out, nv = [], llm.n_vocab()
for _ in range(n):  # the last position's logits, as llama.cpp's context holds them
    tok = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(nv,))))
    out.append(tok)
    llm.eval([tok])
t2 = time.perf_counter()
print(json.dumps({"engine": "llama.cpp (llama-cpp-python %s)" % __version__,
                  "prompt_tokens": len(ids), "prefill_s": t1 - t0, "decode_tokens": n,
                  "decode_s": t2 - t1, "tokens": out}))
