#!/usr/bin/python3
"""Writes DIR/tokenizer.json and DIR/tokenizer_config.json for a vocabulary
of VOCAB ids (usage: hf_tokenizer.py DIR VOCAB): a small BPE tokenizer.json
in the tokenizers library's format (GPT-2's byte symbols, 8 merges written as
strings and as pairs, 3 added tokens of which 2 special, Llama 3's
pre-tokenizer) and a tokenizer_config.json naming BOS and EOS."""
import json, sys
out, vocab_size = sys.argv[1], int(sys.argv[2])
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
sym = {b: chr(c) for b, c in zip(bs, cs)}
vocab = {sym[b]: b for b in range(256)}
pairs = [("t", "h"), ("th", "e"), ("Ġ", "t"), ("e", "r"), ("i", "n"), ("a", "n"), ("o", "n"), ("Ġ", "a")]
merges = []
for a, b in pairs:
    vocab[a + b] = len(vocab); merges.append([a, b] if len(merges) % 2 else f"{a} {b}")
added = [{"id": vocab_size - 4, "content": "<|begin_of_text|>", "special": True},
         {"id": vocab_size - 3, "content": "<|end_of_text|>", "special": True},
         {"id": vocab_size - 2, "content": "<tool>", "special": False}]
llama3 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
          "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
t = {"version": "1.0", "added_tokens": added,
     "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
         {"type": "Split", "pattern": {"Regex": llama3}, "behavior": "Isolated", "invert": False},
         {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
     "model": {"type": "BPE", "vocab": vocab, "merges": merges}}
json.dump(t, open(out + "/tokenizer.json", "w"), ensure_ascii=False)
json.dump({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|end_of_text|>"}, "add_bos_token": True},
          open(out + "/tokenizer_config.json", "w"))
