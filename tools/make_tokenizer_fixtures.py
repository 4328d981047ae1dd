#!/usr/bin/env python3
"""Trains small tokenizers of each kind llmem supports with Hugging Face
`tokenizers`, and writes them with the ids and decoded strings `tokenizers`
gives for a few thousand test strings each (the oracle for
tests/test_tokenizer.c).

    python3 tools/make_tokenizer_fixtures.py [--out tests/fixtures/tokenizers]
        [--n 2200] [--models tests/fixtures]

Needs `pip install tokenizers`. Training text: /work/shared/data/
tinyshakespeare.txt (or --corpus) plus tests/fixtures/tokenizers/
multilingual.txt. Kinds:

  gpt2        byte-level BPE, ByteLevel pre-tokenizer (GPT-2 regex)
  llama3      byte-level BPE, Split(Llama-3 regex) + ByteLevel, BOS by a
              TemplateProcessing post-processor, ignore_merges
  qwen2       byte-level BPE, NFC, Split(Qwen2 regex) + ByteLevel
  spm         SentencePiece-style BPE (Llama-2): Prepend+Replace normalizer,
              byte fallback, BOS post-processor, Replace/ByteFallback/Fuse/
              Strip decoder
  metaspace   BPE with a Metaspace pre-tokenizer (prepend_scheme "first")
              and decoder, byte fallback (Mistral-style)
  falcon      byte-level BPE after Punctuation (contiguous) and before
              Digits and a Split of digit triples (Falcon-style)
  words       NFKC, WhitespaceSplit, Whitespace, Split merged with the
              previous / next, individual Digits; unk; [CLS] $A [SEP]; no
              decoder

Each kind gets special tokens and a non-special added token. cases.jsonl has
one line per string: {"text": s} or {"hex": bytes} (invalid UTF-8; the
oracle saw bytes.decode("utf-8", "replace")), "ids" (add_special_tokens=
True), "decoded" (skip_special_tokens=False), optional "decoded_skip"
(skip_special_tokens=True, when different) and, for strings holding special
tokens, "ids_plain" (add_special_tokens=False, encode_special_tokens=True).

With --models, also writes a 256-entry SentencePiece-style tokenizer (ids
0/1/2 = <unk>/<s>/</s>, as the fixture configs say) with a chat template
into the llama and bamba fixture folders.
"""
import argparse
import json
import os
import random
import sys

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import AddedToken

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

GPT2_RE = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_RE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
             r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_RE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
            r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")

KIND_SPECIALS = {
    "gpt2": ["<|endoftext|>", "<mask>", "<sep>"],
    "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "spm": ["<unk>", "<s>", "</s>"],
    "metaspace": ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"],
    "falcon": [">>ABSTRACT<<", ">>INTRODUCTION<<", "<|endoftext|>"],
    "words": ["<unk>", "[CLS]", "[SEP]"],
}
KIND_ADDED = {  # non-special added tokens
    "gpt2": ["<tool>", "</tool>", "yes"],
    "llama3": ["<|python_tag|>"],
    "qwen2": ["<tool_call>", "</tool_call>"],
    "spm": ["<pad>"],
    "metaspace": ["[TOOL_CALLS]"],
    "falcon": ["<tool>"],
    "words": ["[MASK]"],
}
KIND_CONFIG = {
    "gpt2": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "add_bos_token": False},
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "qwen2": {"bos_token": None, "eos_token": "<|im_end|>"},
    "spm": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True},
    "metaspace": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True},
    "falcon": {"eos_token": "<|endoftext|>"},
    "words": {"unk_token": "<unk>", "cls_token": "[CLS]", "sep_token": "[SEP]"},
}


def byte_tokens():
    return ["<0x%02X>" % b for b in range(256)]


def build(kind, corpus, vocab_size):
    specials = KIND_SPECIALS[kind]
    if kind in ("gpt2", "llama3", "qwen2"):
        tok = Tokenizer(models.BPE())
        if kind == "gpt2":
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        else:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(LLAMA3_RE if kind == "llama3" else QWEN2_RE),
                                     behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
        if kind == "qwen2":
            tok.normalizer = normalizers.NFC()
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        tok.train_from_iterator(corpus, trainer)
        if kind == "llama3":
            tok.post_processor = processors.Sequence([
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                              pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                              special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])])
        else:
            tok.post_processor = processors.ByteLevel(trim_offsets=False)
        tok.add_tokens(KIND_ADDED[kind])
        if kind == "gpt2":  # the added-token flags: lstrip, rstrip, single_word
            tok.add_special_tokens([AddedToken("<mask>", lstrip=True, normalized=False, special=True),
                                    AddedToken("<sep>", rstrip=True, normalized=False, special=True)])
            tok.add_tokens([AddedToken("yes", single_word=True, normalized=False, special=False)])
        if kind == "llama3":
            d = json.loads(tok.to_str())
            d["model"]["ignore_merges"] = True
            tok = Tokenizer.from_str(json.dumps(d))
        return tok
    if kind == "falcon":  # Falcon-style: punctuation and digit splits around ByteLevel
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Punctuation("contiguous"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            pre_tokenizers.Digits(individual_digits=False),
            pre_tokenizers.Split(Regex("[0-9][0-9][0-9]"), behavior="isolated", invert=False)])
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(corpus, trainer)
        tok.add_tokens(KIND_ADDED[kind])
        return tok
    if kind == "words":  # word splits (NFKC, Whitespace, Digits, merged splits), unk, no decoder
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Whitespace(),
            pre_tokenizers.Split("-", behavior="merged_with_previous"),
            pre_tokenizers.Split(Regex("[\u2019']"), behavior="merged_with_next"),
            pre_tokenizers.Digits(individual_digits=True)])
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, limit_alphabet=150,
                                      show_progress=False)
        tok.train_from_iterator(corpus, trainer)
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
        tok.add_tokens(KIND_ADDED[kind])
        return tok
    # SentencePiece-style kinds: train on Metaspace-split words with a
    # limited alphabet, then put <unk> <s> </s> and the 256 byte tokens first.
    tr = Tokenizer(models.BPE(unk_token="<unk>"))
    tr.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  limit_alphabet=120, show_progress=False)
    tr.train_from_iterator(corpus, trainer)
    d = json.loads(tr.to_str())
    old = d["model"]["vocab"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for t in byte_tokens():
        vocab[t] = len(vocab)
    for t, _ in sorted(old.items(), key=lambda kv: kv[1]):
        if t not in vocab:
            vocab[t] = len(vocab)
    d["model"]["vocab"] = vocab
    d["model"]["byte_fallback"] = True
    d["model"]["fuse_unk"] = True
    d["added_tokens"] = []
    tok = Tokenizer.from_str(json.dumps(d))
    if kind == "spm":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.pre_tokenizer = None
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="▁",
                                                                                   prepend_scheme="first")])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                                       special_tokens=[("<s>", 1)])
    tok.add_special_tokens([AddedToken(s, normalized=False, special=True) for s in specials])
    tok.add_tokens([AddedToken(s, normalized=False, special=False) for s in KIND_ADDED[kind]])
    return tok


WS = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "   \n", "\u00a0", "\u3000", "\u2009", "\u200b", "\x0b", "\x0c",
      "\u2028", "\u0085"]
SOUP_RANGES = [(0x20, 0x7e), (0xa0, 0x24f), (0x300, 0x36f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff),
               (0x900, 0x97f), (0xe00, 0xe7f), (0x1100, 0x11ff), (0x2000, 0x206f), (0x2190, 0x23ff),
               (0x3040, 0x30ff), (0x4e00, 0x4fff), (0xac00, 0xad00), (0xff00, 0xffef), (0x1f300, 0x1f6ff),
               (0x1f900, 0x1f9ff), (0x10000, 0x1007f), (0xe000, 0xe0ff)]


def rand_soup(rng, n):
    out = []
    for _ in range(n):
        lo, hi = rng.choice(SOUP_RANGES)
        out.append(chr(rng.randint(lo, hi)))
        if rng.random() < 0.15:
            out.append(rng.choice(WS))
    return "".join(out)


def make_strings(rng, n, shakes_lines, multi_text, specials, added):
    """Returns a list of str or bytes (bytes = possibly invalid UTF-8)."""
    toks = specials + added
    out = ["", " ", "\n", "a", "  ", "\t\t", "é", "e\u0301", "😀", "\u200d", "<", "<|", "▁", "▁▁hi"]
    for t in toks:
        out += [t, t + t, " " + t + " ", "x" + t + "y", t[:-1], "a " + t + "  b\n" + t]
    while len(out) < n:
        r = rng.random()
        if r < 0.28:
            i = rng.randrange(len(shakes_lines))
            s = "\n".join(shakes_lines[i:i + rng.randint(1, 3)])
            a = rng.randrange(len(s) + 1)
            out.append(s[a:a + rng.randint(1, 160)])
        elif r < 0.46:
            a = rng.randrange(len(multi_text))
            out.append(multi_text[a:a + rng.randint(1, 120)])
        elif r < 0.56:
            out.append(rand_soup(rng, rng.randint(1, 40)))
        elif r < 0.66:  # whitespace runs
            parts = []
            for _ in range(rng.randint(1, 6)):
                parts.append(rng.choice(["word", "The", "x", "123", "é", "!", "日本", ""]))
                parts.append(rng.choice(WS) * rng.randint(1, 40))
            out.append("".join(parts))
        elif r < 0.80:  # special and added tokens inside text
            parts = []
            for _ in range(rng.randint(1, 5)):
                if rng.random() < 0.5:
                    parts.append(rng.choice(toks))
                else:
                    ln = shakes_lines[rng.randrange(len(shakes_lines))]
                    parts.append(ln[:rng.randint(0, 40)])
                if rng.random() < 0.4:
                    parts.append(rng.choice(WS))
            out.append("".join(parts))
        elif r < 0.90:  # invalid UTF-8
            base = (shakes_lines[rng.randrange(len(shakes_lines))] + multi_text[rng.randrange(len(multi_text)):][:20])
            b = bytearray(base.encode("utf-8"))
            for _ in range(rng.randint(1, 4)):
                junk = rng.choice([b"\x80", b"\xff", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc0\x80",
                                   b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xfe\xfe", bytes([rng.randint(0x80, 0xff)]),
                                   b"\xe6\x97\xa5"[:rng.randint(1, 3)]])
                p = rng.randint(0, len(b))
                b[p:p] = junk
            if rng.random() < 0.3:
                b = b[:rng.randint(0, len(b))]
            out.append(bytes(b))
        else:  # contractions, digits, code, case
            frag = rng.choice(["I'LL", "don't", "WE'RE", "you'Ve", "it's", "O'Neil", "rock'n'roll", "1234567",
                               "3.14159", "x=1;y=22;", "if(a){b();}", "   indented\n\tcode", "HELLO World",
                               "¡¿", "--->", "...", "https://example.com/a?b=c&d=e", "foo_bar_baz",
                               "ﬁ ① ½", "١٢٣", "Ǆ", "İstanbul", "ß", "ΣΑΣ"])
            out.append(" ".join(frag for _ in range(rng.randint(1, 3))))
    return out[:n]


def as_text(s):
    return s.decode("utf-8", "replace") if isinstance(s, bytes) else s


def write_cases(tok, strings, path, specials):
    with open(path, "w", encoding="utf-8") as f:
        for s in strings:
            text = as_text(s)
            rec = {}
            if isinstance(s, bytes):
                rec["hex"] = s.hex()
            else:
                rec["text"] = s
            tok.encode_special_tokens = False
            ids = tok.encode(text, add_special_tokens=True).ids
            rec["ids"] = ids
            rec["decoded"] = tok.decode(ids, skip_special_tokens=False)
            skip = tok.decode(ids, skip_special_tokens=True)
            if skip != rec["decoded"]:
                rec["decoded_skip"] = skip
            if any(sp in text for sp in specials):
                tok.encode_special_tokens = True
                rec["ids_plain"] = tok.encode(text, add_special_tokens=False).ids
                tok.encode_special_tokens = False
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


def write_config(kind, path, extra=None):
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096}
    cfg.update(KIND_CONFIG[kind])
    if extra:
        cfg.update(extra)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
        f.write("\n")


LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/fixtures/tokenizers"))
    ap.add_argument("--corpus", default="/work/shared/data/tinyshakespeare.txt")
    ap.add_argument("--n", type=int, default=2200)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--models", default=None, help="fixture root: add tokenizer.json to llama/ and bamba/")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    shakes = open(args.corpus, encoding="utf-8").read()
    multi = open(os.path.join(args.out, "multilingual.txt"), encoding="utf-8").read()
    shakes_lines = [l for l in shakes.split("\n")]
    corpus = shakes_lines + multi.split("\n") * 30
    for kind in ["gpt2", "llama3", "qwen2", "spm", "metaspace", "falcon", "words"]:
        rng = random.Random(args.seed + len(kind))
        tok = build(kind, corpus, args.vocab)
        d = os.path.join(args.out, kind)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"), pretty=False)
        write_config(kind, os.path.join(d, "tokenizer_config.json"))
        strings = make_strings(rng, args.n, shakes_lines, multi, KIND_SPECIALS[kind], KIND_ADDED[kind])
        write_cases(tok, strings, os.path.join(d, "cases.jsonl"), KIND_SPECIALS[kind])
        print(kind, tok.get_vocab_size(), len(strings), file=sys.stderr)
    if args.models:
        # a 256-entry tokenizer: <unk> <s> </s> then 253 trained pieces, no
        # byte fallback (the fixtures' vocab_size is 256)
        tr = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
        tr.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tr.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
        trainer = trainers.BpeTrainer(vocab_size=256, special_tokens=["<unk>", "<s>", "</s>"],
                                      limit_alphabet=90, show_progress=False)
        tr.train_from_iterator(shakes_lines, trainer)
        tr.pre_tokenizer = None
        tr.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
        tr.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                                          special_tokens=[("<s>", 1)])
        assert tr.get_vocab_size() == 256, tr.get_vocab_size()
        assert [tr.token_to_id(t) for t in ("<unk>", "<s>", "</s>")] == [0, 1, 2]
        for fx in ("llama", "bamba"):
            d = os.path.join(args.models, fx)
            tr.save(os.path.join(d, "tokenizer.json"), pretty=False)
            write_config("spm", os.path.join(d, "tokenizer_config.json"), {"chat_template": LLAMA2_TEMPLATE})


if __name__ == "__main__":
    main()
