#!/usr/bin/env python3
"""Expected values for tests/model/test_tokenizer.c, computed independently of the
C code (development time only; the C test does not run Python):

  1. byte-level BPE ids for SmolLM2: a `tokenizers` BPE model built from the
     vocabulary and merges read out of the GGUF file with the `gguf` package,
     with SmolLM2's pre-tokenizer Sequence([Digits(individual_digits=True),
     ByteLevel(add_prefix_space=False, use_regex=True)]) and its control
     tokens added as special tokens;
  2. pre-tokenizer splits: `regex.findall` with the qwen2 / llama-bpe / gpt2
     patterns (smollm: digits split off first, then the gpt2 pattern);
  3. SentencePiece-style ids for tok512.bin: a re-implementation of llama2.c's
     encoder (per-code-point lookup with byte fallback, then repeatedly merge
     the leftmost best-scoring pair) on the llama2.c tokenizer file.

Usage: python3 scripts/tokenizer-expected.py [model.gguf] [tok512.bin] > /tmp/expected.c
and paste the printed C arrays into tests/model/test_tokenizer.c.
"""
import struct
import sys

import regex

MODEL = sys.argv[1] if len(sys.argv) > 1 else "models/SmolLM2-135M-Instruct.Q4_1.gguf"
TOK512 = sys.argv[2] if len(sys.argv) > 2 else "../shared/models/tok512.bin"

BPE_STRINGS = [
    "Hello world",
    "café naïve",
    "日本語のテキスト",
    "👋🌍",
    "def f(x):\n\treturn x  + 1\n",
    "   hi",
    "12345 and 3.14",
    "I'm sure they'll",
    "<|im_start|>user\nhi<|im_end|>",
    "Don't STOP, it's 1/2 ½ ²!  \n\n  x",
]

SPLIT_STRINGS = [
    "Hello world",
    "I'm sure THEY'LL say 'hello' it's",
    "def f(x):\n\treturn x  + 1\n",
    "   hi  there \n\n\n  x\r\n",
    "12345 and 3.14 or 1,000,000",
    "café naïve 日本語のテキスト 👋🌍",
    "(hello) [world] ...wow!!\n\nok",
    "\ttab\t\tx  \u00a0y\u3000z",
    "a\n b\n\n c   ",
    "½²③ x٣",
]

SPM_STRINGS = [
    "Once upon a time, there was a little girl named Lily.",
    "Hello world",
    "  two  spaces ",
    "café naïve 日本",
    "\n\tTab",
    "x",
]

GPT2_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
QWEN2_PAT = r"""(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
LLAMA3_PAT = QWEN2_PAT.replace(r"|\p{N}|", r"|\p{N}{1,3}|")


def c_str(b):
    """C string literal for bytes b (octal escapes: never swallow a following digit)."""
    out = []
    for x in b:
        if 0x20 <= x < 0x7F and x not in (0x22, 0x5C, 0x3F):
            out.append(chr(x))
        else:
            out.append("\\%03o" % x)
    return '"' + "".join(out) + '"'


def c_ints(xs):
    return "{" + ", ".join(str(x) for x in xs) + "}"


def bpe_expected():
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    r = gguf.GGUFReader(MODEL)

    def strs(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = strs("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in strs("tokenizer.ggml.merges")]
    tt = r.fields["tokenizer.ggml.token_type"]
    types = [int(tt.parts[i][0]) for i in tt.data]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty in (3, 4)])
    print("// ids from the `tokenizers` package (BPE built from the GGUF vocabulary and")
    print("// merges, pre-tokenizer Digits(individual) + ByteLevel), see scripts/tokenizer-expected.py")
    print("static const struct { const char *text; int n; int32_t ids[64]; } bpe_cases[] = {")
    for s in BPE_STRINGS:
        ids = tok.encode(s, add_special_tokens=False).ids
        assert tok.decode(ids, skip_special_tokens=False) == s
        print("    {%s, %d, %s}," % (c_str(s.encode()), len(ids), c_ints(ids)))
    print("};")


def split_expected():
    def smollm(s):
        out = []
        for part in regex.split(r"(\p{N})", s):
            if part:
                out += regex.findall(GPT2_PAT, part)
        return out

    splitters = [
        ("gpt2", lambda s: regex.findall(GPT2_PAT, s)),
        ("smollm", smollm),
        ("qwen2", lambda s: regex.findall(QWEN2_PAT, s)),
        ("llama-bpe", lambda s: regex.findall(LLAMA3_PAT, s)),
    ]
    print("// pieces from Python's `regex` findall on the reference patterns, see scripts/tokenizer-expected.py")
    print("static const struct { const char *pre, *text; int n; int lens[64]; } split_cases[] = {")
    for name, f in splitters:
        for s in SPLIT_STRINGS:
            parts = f(s)
            assert "".join(parts) == s
            lens = [len(p.encode()) for p in parts]
            assert len(lens) <= 64
            print("    {%s, %s, %d, %s}," % (c_str(name.encode()), c_str(s.encode()), len(lens), c_ints(lens)))
    print("};")


def spm_expected():
    d = open(TOK512, "rb").read()
    o = 4
    pieces, scores = [], []
    while o < len(d):
        sc, n = struct.unpack_from("<fi", d, o)
        o += 8
        pieces.append(d[o:o + n])
        scores.append(sc)
        o += n
    lookup = {p: i for i, p in enumerate(pieces)}

    def encode(text):
        b = text.encode()
        ids = [lookup[b" "]] if b else []  # add_dummy_prefix
        for ch in text:  # one code point at a time, bytes as fallback
            cb = ch.encode()
            if cb in lookup:
                ids.append(lookup[cb])
            else:
                ids += [x + 3 for x in cb]
        while True:
            best, best_i, best_id = -1e10, -1, -1
            for i in range(len(ids) - 1):
                m = lookup.get(pieces[ids[i]] + pieces[ids[i + 1]])
                if m is not None and scores[m] > best:
                    best, best_i, best_id = scores[m], i, m
            if best_i < 0:
                return ids
            ids[best_i:best_i + 2] = [best_id]

    print("// ids from a Python re-implementation of llama2.c's encoder on tok512.bin,")
    print("// see scripts/tokenizer-expected.py (BOS not included)")
    print("static const struct { const char *text; int n; int32_t ids[96]; } spm_cases[] = {")
    for s in SPM_STRINGS:
        ids = encode(s)
        assert len(ids) <= 96
        print("    {%s, %d, %s}," % (c_str(s.encode()), len(ids), c_ints(ids)))
    print("};")


if __name__ == "__main__":
    bpe_expected()
    print()
    split_expected()
    print()
    spm_expected()
