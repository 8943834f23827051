"""Small real tokenizers carrying each code family's real special-token strings.

Each is a byte-level BPE trained in milliseconds on a little code, with the family's special tokens
added as special AddedTokens, written as tokenizer.json + tokenizer_config.json and loaded back
through `nextok.tokenizer.Tokenizer.from_dir` (the path a Hugging Face model directory takes).
"""
from __future__ import annotations

import json
import os

from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers
from tokenizers.trainers import BpeTrainer

from nextok.tokenizer import Tokenizer

_DS = "<\uff5c{}\uff5c>"  # DeepSeek: U+FF5C fullwidth vertical bars, U+2581 for spaces

# Special tokens as in each family's released tokenizer (a subset; ids are ours). The first one
# is the EOS token.
FAMILY_SPECIAL_TOKENS: dict[str, list[str]] = {
    "starcoder2": ["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>",
                   "<repo_name>", "<file_sep>", "<issue_start>", "<issue_comment>",
                   "<jupyter_start>"],
    "starcoder": ["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>",
                  "<filename>", "<gh_stars>", "<issue_start>", "<reponame>"],
    "qwen2.5-coder": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>",
                      "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>",
                      "<|file_sep|>"],
    "codellama": ["</s>", "<unk>", "<s>", "\u2581<PRE>", "\u2581<MID>", "\u2581<SUF>",
                  "\u2581<EOT>"],
    "deepseek-coder": [_DS.format("end\u2581of\u2581sentence"), _DS.format("begin\u2581of\u2581sentence"),
                       _DS.format("fim\u2581hole"), _DS.format("fim\u2581begin"),
                       _DS.format("fim\u2581end"), "<|EOT|>"],
    # SmolLM2's special tokens: StarCoder-style repo tokens, but no FIM tokens.
    "smollm2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>",
                "<file_sep>", "<filename>", "<gh_stars>", "<issue_start>"],
}

_CORPUS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "int main(void) {\n    printf(\"%d\\n\", 42);\n    return 0;\n}\n",
    "function add(a, b) {\n  return a + b;\n}\nconst x = add(1, 2);\n",
    "import os\nimport sys\nfrom typing import List\n\nprint('hello world')\n",
    "for (let i = 0; i < n; i++) {\n  total += values[i];\n}\n",
] * 4


def build_tokenizer(family: str, directory: str) -> Tokenizer:
    """A real tokenizer with `family`'s special tokens, saved into `directory` and loaded back."""
    specials = FAMILY_SPECIAL_TOKENS[family]
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=400, show_progress=False,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    os.makedirs(directory, exist_ok=True)
    tok.save(os.path.join(directory, "tokenizer.json"))
    config = {"eos_token": specials[0], "add_bos_token": False,
              "added_tokens_decoder": {
                  str(tok.token_to_id(t)): {"content": t, "special": True, "normalized": False,
                                            "lstrip": False, "rstrip": False,
                                            "single_word": False}
                  for t in specials}}
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False)
    return Tokenizer.from_dir(directory)


def token_counter(tokenizer: Tokenizer):
    """count_tokens for build_code_prompt: special-token strings count as one token."""
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))
