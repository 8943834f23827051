"""Text <-> token ids, and chat templates, on the Rust `tokenizers` library.

Two sources: the tokenizer a GGUF file carries in its metadata (`from_gguf`), or a Hugging Face
directory with tokenizer.json (`from_dir`). transformers is never imported here; the tests use it
as the reference. Chat templates are rendered the way transformers does (sandboxed Jinja with
trim_blocks/lstrip_blocks, `raise_exception`, a non-escaping `tojson`), so prompts match.
"""
from __future__ import annotations

import json
import os
from datetime import datetime
from functools import cached_property

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

from nextok.errors import InvalidRequestError, ModelLoadError

# GGUF token_type values (llama.cpp's llama_token_type).
_CONTROL, _USER_DEFINED = 3, 4

# The GPT-2 split regex is what ByteLevel(use_regex=True) applies itself; these are the other
# split patterns llama.cpp knows by pre-type name, written as in the models' tokenizer.json.
_LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_RE = _LLAMA3_RE.replace(r"\p{N}{1,3}", r"\p{N}")
# Pre-types that split every digit on its own before the GPT-2 regex (StarCoder lineage).
_DIGIT_PRE_TYPES = {"smollm", "starcoder", "refact", "codeshell"}


def _gpt2_byte_of_char() -> dict[str, int]:
    """ByteLevel's alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes
    for the chars from U+0100 up, in byte order (GPT-2's bytes_to_unicode, inverted)."""
    plain = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = [b for b in range(256) if b not in plain]
    return {**{chr(b): b for b in plain}, **{chr(0x100 + n): b for n, b in enumerate(shifted)}}


def _byte_level(use_regex: bool) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)


def _pre_tokenizer(pre: str | None) -> tuple[pre_tokenizers.PreTokenizer, bool]:
    """-> (pre-tokenizer, ignore_merges) for a GGUF `tokenizer.ggml.pre` value."""
    if pre in (None, "", "gpt2", "default"):
        return _byte_level(True), False
    if pre in _DIGIT_PRE_TYPES:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        _byte_level(True)]), False
    if pre in ("llama-bpe", "llama3", "qwen2"):
        regex = _QWEN2_RE if pre == "qwen2" else _LLAMA3_RE
        split = pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)
        # Llama 3 looks a whole pre-token up in the vocab before merging (ignore_merges).
        return pre_tokenizers.Sequence([split, _byte_level(False)]), pre != "qwen2"
    raise ModelLoadError(f"unsupported GGUF tokenizer pre-type {pre!r}")


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from None


def _ids(value) -> list[int]:
    """An `eos_token_id` from a config: an int, a list of ints, or absent."""
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list) else [value])]


def _content(token) -> str | None:
    """tokenizer_config.json writes special tokens either as a string or as an AddedToken dict."""
    return token.get("content") if isinstance(token, dict) else token


class Tokenizer:
    def __init__(self, tok: tokenizers.Tokenizer, *, bos_token_id: int | None,
                 eos_token_id: int | None, eos_token_ids: tuple[int, ...] = (),
                 add_bos: bool = False, chat_template: str | None = None,
                 vocab_size: int | None = None):
        self._tok = tok
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.eos_token_ids = tuple(dict.fromkeys(
            ([eos_token_id] if eos_token_id is not None else []) + list(eos_token_ids)))
        # True when BOS must be prepended by us: a GGUF flag, or a tokenizer.json whose
        # post-processor does not already add it.
        self._add_bos = add_bos and bos_token_id is not None
        self.chat_template = chat_template
        self.vocab_size = vocab_size or tok.get_vocab_size(with_added_tokens=True)
        added = tok.get_added_tokens_decoder()
        self.all_special_ids = sorted(i for i, t in added.items() if t.special)

    # ---- construction --------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, path: str, reader=None) -> Tokenizer:
        """`reader`: an open `gguf.GGUFReader` of `path`, to share the parse with the weights
        loader (parsing a file's metadata takes seconds)."""
        meta = _gguf_metadata(path, reader)
        model = meta.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ModelLoadError(f"unsupported GGUF tokenizer model {model!r} in {path} "
                                 "(only 'gpt2' byte-level BPE is supported)")
        tokens, merges = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.merges")
        if not tokens or merges is None:
            raise ModelLoadError(f"{path} has no tokenizer vocabulary or merges in its metadata")
        types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        pre, ignore_merges = _pre_tokenizer(meta.get("tokenizer.ggml.pre"))
        vocab: dict[str, int] = {}
        for i, t in enumerate(tokens):
            vocab.setdefault(t, i)  # a duplicated string keeps its first id
        # Byte-level tokens never contain a plain space, so the first space separates the pair.
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        tok = tokenizers.Tokenizer(models.BPE(vocab, pairs, ignore_merges=ignore_merges))
        tok.pre_tokenizer = pre
        tok.decoder = decoders.ByteLevel()
        # Control tokens are matched whole in text and dropped by skip_special_tokens;
        # user-defined ones are matched whole but kept as text.
        tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                for i, ty in enumerate(types) if ty == _CONTROL])
        tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                        for i, ty in enumerate(types) if ty == _USER_DEFINED])
        eos = meta.get("tokenizer.ggml.eos_token_id")
        extra = [meta.get(k) for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")]
        return cls(tok, bos_token_id=meta.get("tokenizer.ggml.bos_token_id"), eos_token_id=eos,
                   eos_token_ids=tuple(int(e) for e in extra if e is not None),
                   add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
                   chat_template=meta.get("tokenizer.chat_template"), vocab_size=len(tokens))

    @classmethod
    def from_dir(cls, path: str) -> Tokenizer:
        tj = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tj):
            raise ModelLoadError(f"no tokenizer.json in {path}")
        try:
            tok = tokenizers.Tokenizer.from_file(tj)
        except Exception as e:  # the Rust side raises plain Exception on a bad file
            raise ModelLoadError(f"cannot load {tj}: {e}") from None
        cfg = _read_json(os.path.join(path, "tokenizer_config.json"))
        gen = _read_json(os.path.join(path, "generation_config.json"))
        model_cfg = _read_json(os.path.join(path, "config.json"))
        _mark_special(tok, cfg.get("added_tokens_decoder") or {})

        def token_id(name: str) -> int | None:
            text = _content(cfg.get(name))
            return tok.token_to_id(text) if text else None

        cfg_ids = _ids(gen.get("eos_token_id")) + _ids(model_cfg.get("eos_token_id"))
        eos = token_id("eos_token")
        if eos is None and cfg_ids:
            eos = cfg_ids[0]
        bos = token_id("bos_token")
        if bos is None:
            bos = next(iter(_ids(gen.get("bos_token_id")) + _ids(model_cfg.get("bos_token_id"))), None)
        # Most tokenizer.json files add BOS in their post-processor already; only add it
        # ourselves when the config asks for it and the post-processor stays silent.
        silent = len(tok.encode("a").ids) == len(tok.encode("a", add_special_tokens=False).ids)
        add_bos = bool(cfg.get("add_bos_token", False)) and silent
        return cls(tok, bos_token_id=bos, eos_token_id=eos, eos_token_ids=tuple(cfg_ids),
                   add_bos=add_bos, chat_template=_dir_chat_template(path, cfg))

    # ---- encode / decode -----------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self._add_bos:
            ids.insert(0, self.bos_token_id)
        return ids

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        encs = self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)
        pre = [self.bos_token_id] if add_special_tokens and self._add_bos else []
        return [pre + e.ids for e in encs]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def byte_pieces(self, skip_special_tokens: bool) -> list[bytes] | None:
        """Each id's bytes in decoded text, for a byte-level BPE decoder; None for any other.

        With ByteLevel, `decode(ids)` is the ids' token strings mapped char by char back to bytes
        (a token with a char outside the map, e.g. an added one, by its own UTF-8), joined, and
        read as UTF-8 with U+FFFD for bad bytes; skipped special tokens and ids outside the
        vocabulary add nothing. So streamed text can be built from these bytes one token at a
        time, without a decode call per token (tests/unit/test_detokenizer.py checks it equal)."""
        return self._byte_pieces[skip_special_tokens] if self._byte_pieces else None

    @cached_property
    def _byte_pieces(self) -> tuple[list[bytes], list[bytes]] | None:
        # (not skipping, skipping) special tokens; built once, ~0.1 s for 150k tokens
        if type(self._tok.decoder) is not decoders.ByteLevel:
            return None
        byte_of = _gpt2_byte_of_char()
        pieces = []
        for i in range(self._tok.get_vocab_size(with_added_tokens=True)):
            token = self._tok.id_to_token(i) or ""
            try:
                pieces.append(bytes(byte_of[c] for c in token))
            except KeyError:
                pieces.append(token.encode())
        skipping = list(pieces)
        for i in self.all_special_ids:
            if i < len(skipping):
                skipping[i] = b""
        return pieces, skipping

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [self._tok.id_to_token(int(i)) for i in ids]

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(int(i))

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    @property
    def num_special_tokens(self) -> int:
        return len(self.all_special_ids)

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying `tokenizers.Tokenizer` (e.g. to save it as tokenizer.json)."""
        return self._tok

    def save(self, directory: str) -> None:
        """Writes tokenizer.json, tokenizer_config.json and generation_config.json (the EOS ids)
        into directory, in the layout `from_dir` (and transformers) read back."""
        os.makedirs(directory, exist_ok=True)
        self._tok.save(os.path.join(directory, "tokenizer.json"))
        cfg = {"bos_token": self.bos_token, "eos_token": self.eos_token,
               "add_bos_token": self._add_bos, "chat_template": self.chat_template}
        with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
            json.dump({k: v for k, v in cfg.items() if v is not None}, f, indent=1)
        with open(os.path.join(directory, "generation_config.json"), "w") as f:
            json.dump({"eos_token_id": list(self.eos_token_ids)}, f)

    @property
    def bos_token(self) -> str | None:
        return self.id_to_token(self.bos_token_id) if self.bos_token_id is not None else None

    @property
    def eos_token(self) -> str | None:
        return self.id_to_token(self.eos_token_id) if self.eos_token_id is not None else None

    # ---- chat ----------------------------------------------------------------------------
    @cached_property
    def _template(self):
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            # Jinja's own tojson escapes HTML characters; templates expect plain JSON.
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                              separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            return env.from_string(self.chat_template)
        except jinja2.TemplateError as e:
            raise ModelLoadError(f"the model's chat template does not parse: {e}") from None

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **kwargs) -> str:
        """Render `messages` with the model's Jinja chat template into a prompt string."""
        import jinja2

        if not self.chat_template:
            raise InvalidRequestError("this model's tokenizer has no chat template; "
                                      "send a plain text prompt instead of chat messages")
        variables = {"bos_token": self.bos_token or "", "eos_token": self.eos_token or "",
                     "tools": None, "documents": None, **kwargs}
        try:
            return self._template.render(messages=messages,
                                         add_generation_prompt=add_generation_prompt, **variables)
        except jinja2.TemplateError as e:
            raise InvalidRequestError(f"the chat template rejected the messages: {e}") from None


def _gguf_metadata(path: str, reader=None) -> dict:
    """The `tokenizer.*` key/values of a GGUF file, as Python values.

    Parsed with nextok's own header reader (0.1 s on the default model; gguf.GGUFReader takes
    seconds); `reader`, an open gguf.GGUFReader, is still accepted.
    """
    if reader is not None:
        try:
            return {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}
        except Exception as e:  # gguf raises ValueError/struct errors/IndexError on a bad file
            raise ModelLoadError(f"{path} is not a readable GGUF file: {e}") from None
    if not os.path.isfile(path):
        raise ModelLoadError(f"tokenizer file not found: {path}")
    from nextok.model.gguf import GGUFFile

    meta = GGUFFile(path).metadata  # raises ModelLoadError on a bad file
    return {k: v for k, v in meta.items() if k.startswith("tokenizer.")}


def _mark_special(tok: tokenizers.Tokenizer, decoder: dict) -> None:
    """Re-add tokens that tokenizer_config.json calls special but tokenizer.json does not."""
    have = tok.get_added_tokens_decoder()
    fix = [AddedToken(d["content"], special=True, normalized=d.get("normalized", False),
                      lstrip=d.get("lstrip", False), rstrip=d.get("rstrip", False),
                      single_word=d.get("single_word", False))
           for i, d in decoder.items()
           if d.get("special") and not (int(i) in have and have[int(i)].special)]
    if fix:
        tok.add_special_tokens(fix)


def _dir_chat_template(path: str, cfg: dict) -> str | None:
    """chat_template.jinja (newer layout), else tokenizer_config.json's chat_template, which may be
    a list of named templates: take the one named 'default'."""
    jinja_file = os.path.join(path, "chat_template.jinja")
    if os.path.isfile(jinja_file):
        with open(jinja_file, encoding="utf-8") as f:
            return f.read()
    tpl = cfg.get("chat_template")
    if isinstance(tpl, list):
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default") or next(iter(named.values()), None)
    return tpl
