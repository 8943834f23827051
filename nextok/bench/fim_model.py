"""A random-weight FIM checkpoint with SmolLM2-135M's shape, for code-completion benchmarks.

    python -m nextok.bench.fim_model /tmp/fimmodel
    nextok serve --model /tmp/fimmodel --load-format dummy --fim-order spm

The default model (SmolLM2-135M-Instruct) has no FIM tokens, so /v1/code/complete falls back to a
prefix-only prompt and the SPM-vs-PSM comparison cannot be made on it. This writes a Hugging Face
directory (config.json, tokenizer.json, tokenizer_config.json) whose tokenizer is the default
model's real one plus StarCoder2's FIM tokens, and whose config is SmolLM2-135M's shape: the
server detects the starcoder2 FIM family from the vocabulary and runs at the real model's speed
(`--load-format dummy` draws the weights). Completions are random text; latency and cache
behaviour are what the benchmark measures.

One departure from SmolLM2: the output head is not tied to the embeddings. With tied random
weights the residual stream stays close to the last input token's embedding, so greedy decoding
repeats that token; in PSM the last token is <fim_middle>, a stop token, so every PSM completion
would end after one token while SPM ones (ending in code) run to max_tokens, and an SPM-vs-PSM
comparison would measure completion length, not prompt order. An untied head costs the same
matmul per token, so the speed stays the real model's.
"""
from __future__ import annotations

import argparse
import json
import os

# StarCoder2's FIM and repo-level tokens. SmolLM2's vocabulary already holds <repo_name> and
# <file_sep> (its pretraining used StarCoder data); adding them again keeps their ids.
FIM_TOKENS = ("<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<file_sep>", "<repo_name>")
EOS_TOKEN = "<|endoftext|>"

# SmolLM2-135M (HuggingFaceTB/SmolLM2-135M config.json).
SMOLLM2_135M_SHAPE = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                      "num_attention_heads": 9, "num_key_value_heads": 3}


def fim_tokenizer():
    """The default model's tokenizer with the FIM tokens added as special tokens (a copy: the
    loaded one is left as it was)."""
    import tokenizers
    from tokenizers import AddedToken

    from nextok import hub
    from nextok.tokenizer import Tokenizer

    base = Tokenizer.from_gguf(hub.resolve_model(None))
    tok = tokenizers.Tokenizer.from_str(base.backend.to_str())
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in FIM_TOKENS])
    return tok


def model_config(vocab_size: int, eos_id: int, **shape) -> dict:
    """config.json of a LlamaForCausalLM with SmolLM2-135M's shape, head untied (see the module
    docstring); `shape` overrides (tests use a tiny one). head_dim is hidden / heads."""
    unknown = set(shape) - set(SMOLLM2_135M_SHAPE)
    if unknown:
        raise ValueError(f"unknown shape keys {sorted(unknown)} (known: {sorted(SMOLLM2_135M_SHAPE)})")
    dims = {**SMOLLM2_135M_SHAPE, **shape}
    if dims["hidden_size"] % dims["num_attention_heads"] or \
            dims["num_attention_heads"] % dims["num_key_value_heads"]:
        raise ValueError(f"inconsistent attention shape {dims}")
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", **dims,
        "hidden_act": "silu", "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0, "tie_word_embeddings": False, "attention_bias": False,
        "vocab_size": vocab_size, "bos_token_id": eos_id, "eos_token_id": eos_id,
        "torch_dtype": "bfloat16",
    }


def _tokenizer_config(tok) -> dict:
    """What Tokenizer.from_dir reads: EOS, no BOS added, and which added tokens are special."""
    decoder = tok.get_added_tokens_decoder()
    return {
        "eos_token": EOS_TOKEN, "bos_token": EOS_TOKEN, "add_bos_token": False,
        "model_max_length": 8192,
        "added_tokens_decoder": {
            str(i): {"content": t.content, "special": t.special, "normalized": False,
                     "lstrip": False, "rstrip": False, "single_word": False}
            for i, t in sorted(decoder.items())},
    }


def write_fim_model(directory: str, **shape) -> str:
    """Writes the checkpoint into `directory`; checks nextok reads it back as a starcoder2 FIM
    model (raises RuntimeError otherwise) and returns `directory`."""
    tok = fim_tokenizer()
    eos_id = tok.token_to_id(EOS_TOKEN)
    os.makedirs(directory, exist_ok=True)
    tok.save(os.path.join(directory, "tokenizer.json"))
    files = {"tokenizer_config.json": _tokenizer_config(tok),
             "config.json": model_config(tok.get_vocab_size(with_added_tokens=True), eos_id, **shape),
             "generation_config.json": {"bos_token_id": eos_id, "eos_token_id": eos_id}}
    for name, data in files.items():
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, ensure_ascii=False)
            f.write("\n")
    _check(directory)
    return directory


def _check(directory: str) -> None:
    """The server must detect the FIM family and stop on EOS, or the benchmark measures the
    prefix-only fallback without saying so."""
    from nextok.server.fim import detect_fim_format
    from nextok.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(directory)
    fmt = detect_fim_format(tok)
    if fmt is None or fmt.name != "starcoder2" or not fmt.spm:
        raise RuntimeError(f"{directory}: FIM format detected as {fmt and fmt.name!r}, "
                           "expected 'starcoder2'")
    if tok.eos_token != EOS_TOKEN:
        raise RuntimeError(f"{directory}: EOS read back as {tok.eos_token!r}, expected {EOS_TOKEN!r}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nextok.bench.fim_model", description=__doc__.split("\n\n")[0])
    p.add_argument("directory")
    p.add_argument("--num-layers", type=int, default=None, help="default: SmolLM2-135M's 30")
    p.add_argument("--hidden-size", type=int, default=None, help="default: 576")
    p.add_argument("--intermediate-size", type=int, default=None, help="default: 1536")
    p.add_argument("--num-heads", type=int, default=None, help="default: 9")
    p.add_argument("--num-kv-heads", type=int, default=None, help="default: 3")
    args = p.parse_args(argv)
    given = {"num_hidden_layers": args.num_layers, "hidden_size": args.hidden_size,
             "intermediate_size": args.intermediate_size, "num_attention_heads": args.num_heads,
             "num_key_value_heads": args.num_kv_heads}
    path = write_fim_model(args.directory, **{k: v for k, v in given.items() if v is not None})
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    print(f"wrote {path}: {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
          f"vocab {cfg['vocab_size']}; serve it with --load-format dummy")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
