"""SchedulerOutput -> input tensors -> model -> logits of the sampling rows -> sampler -> tokens.

Owns the model, the paged KV pool and the per-sequence sampling generators. Only this layer
(and kernels/) touches the device.
"""
from __future__ import annotations

import logging

import torch

from nextok.attention.torch_ref import TorchRefBackend
from nextok.config import EngineConfig
from nextok.engine.scheduler import SchedulerOutput
from nextok.model.registry import default_dtype, model_class
from nextok.worker.cpu_memory import lazy_zeros
from nextok.worker.sampler import Sampler, SamplingMetadata
from nextok.worker.step_inputs import StepInputs
from nextok.worker.step_output import LastHidden, LaunchedStep, ModelOutput, SeqLogprobs

log = logging.getLogger("nextok")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner(StepInputs):
    def __init__(self, config: EngineConfig, weights, max_model_len: int, blocks=None):
        """weights: (name, tensor) iterator, None for dummy weights; blocks: a checkpoint's
        `blocks(type_ids)` to keep GGUF weights as blocks, on CPU for decode, on CUDA as the only
        copy (None: never)."""
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = DTYPES[config.dtype]
        mc = config.model
        self.max_model_len = max_model_len
        self.backend = self._make_backend()
        self.graphs = None  # a CudaGraphRunner once the KV pool exists (CUDA, triton, not eager)
        cls = model_class(mc.architecture)
        # Parameters are made on the device in the model's dtype: made in float32 first, a bf16
        # model needed twice its own memory at load (an 8B model 32 GB, not 16).
        with torch.device(self.device), default_dtype(self.dtype):
            model = cls(mc, self.backend, max_positions=max_model_len)
        model.to(self.dtype)  # what a module made in float32 on purpose (none today)
        if weights is None:
            model.init_dummy_weights(config.seed)
        else:
            model.load_weights(weights)
        if config.quantization:  # before anything binds to the dense weights
            from nextok.quant import get_quant_method, quantize_model

            method = get_quant_method(config.quantization, config.quant_group_size)
            method.check(self.device, self.dtype)
            quantize_model(model, method, lm_head=config.quantize_lm_head)
        if blocks is not None and weights is not None and self._gguf_on_device():
            from nextok.quant.gguf_cuda import TYPE_IDS

            # before anything binds to the weights; --gguf-blocks-only keeps Q8_0 / Q5_* / Q6_K blocks
            model.use_gguf_device_blocks(blocks(TYPE_IDS), int8=config.gguf_dense_copy)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()  # the dropped dense weights: free for the KV pool
        if self.device.type == "cuda" or config.cpu_kernels:
            from nextok.kernels.select import fused_ops_for

            model.set_fused_ops(fused_ops_for(self.device, self.dtype))
        if self.device.type == "cpu" and config.cpu_kernels:
            model.pack_for_cpu(self.dtype)
            if blocks is not None and weights is not None and self._gguf_blocks_apply():
                from nextok.kernels.cpu_gguf_linear import supported_types

                model.use_gguf_blocks(blocks(supported_types()), keep_dense=config.gguf_dense_copy,
                                      activations=config.gguf_activations)
        self.model = model.eval()
        self.sampler = Sampler()
        self.generators: dict[int, torch.Generator] = {}
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.block_size = config.cache.block_size
        # The last launched step's sampled tokens on the device, and each sampling sequence's
        # row in them: the next step's PENDING input tokens are taken from there.
        self._last_sampled: torch.Tensor | None = None
        self._last_rows: dict[int, int] = {}
        from nextok.spec import needs_hidden_states

        self.return_hidden = needs_hidden_states(config.speculative)  # ModelOutput.hidden

    def _make_backend(self):
        if self.config.attention_backend == "triton":
            from nextok.attention.triton_backend import TritonBackend

            return TritonBackend()
        return TorchRefBackend(self._cpu_decode_kernel())

    def _gguf_on_device(self) -> bool:
        """CUDA: GGUF weights stay as their blocks (quant/gguf_cuda.py), unless --no-gguf-blocks
        or --quantization. (Tests turn it on for CPU engines in Triton's interpreter.)"""
        return self.device.type == "cuda" and self.config.gguf_blocks and not self.config.quantization

    def _gguf_blocks_apply(self) -> bool:
        if (self.dtype not in (torch.float32, torch.bfloat16) or not self.config.gguf_blocks
                or self.config.quantization):
            return False
        from nextok.kernels.cpu_gguf_linear import load_gguf_matmul

        return load_gguf_matmul(self.config.gguf_activations) is not None

    def _cpu_decode_kernel(self):
        if (self.device.type != "cpu" or self.dtype not in (torch.float32, torch.bfloat16)
                or not self.config.cpu_kernels):
            return None
        from nextok.kernels.cpu_attention import load_paged_decode, q8_supported

        fns = load_paged_decode()
        kind, m = self.config.cache.kv_cache_dtype, self.config.model
        if kind == "auto":
            return fns
        # int8 rows with their scale where this build has the kernel for the shape; fp8 caches
        # (and the rest) stay on the torch path, which then needs its decode mask
        if kind == "int8" and q8_supported(fns, m.num_attention_heads, m.num_key_value_heads, m.head_dim):
            return fns
        return None

    # ---- KV pool -------------------------------------------------------------------------
    def _kv_row(self) -> tuple[torch.dtype, int]:
        """(cache dtype, elements per cached row of one token and KV head)."""
        from nextok.attention import kv_quant

        head_dim = self.config.model.head_dim
        kind = self.config.cache.kv_cache_dtype
        if kind == "auto":
            return self.dtype, head_dim
        return kv_quant.DTYPES[kind], kv_quant.row_width(kv_quant.DTYPES[kind], head_dim)

    def kv_bytes_per_block(self) -> int:
        mc = self.config.model
        dtype, row = self._kv_row()
        elem = torch.tensor([], dtype=dtype).element_size()
        return 2 * mc.num_hidden_layers * self.block_size * mc.num_key_value_heads * row * elem

    def new_kv_caches(self, num_blocks: int, num_layers: int | None = None) -> list:
        """(K, V) pools of num_blocks blocks for the first num_layers layers (default: all), in
        this runner's layout and cache dtype. Also a draft model's own pool (spec/draft.py)."""
        mc = self.config.model
        dtype, row = self._kv_row()
        shape = self.backend.kv_cache_shape(num_blocks, self.block_size, mc.num_key_value_heads, row)
        # Zeroed, not empty: padded slots are masked, but 0 * NaN garbage would still poison SDPA
        # (a zero row of a quantized cache dequantizes to zeros). CPU: zeroed as written (cpu_memory.py).
        zeros = lazy_zeros if self.device.type == "cpu" else torch.zeros
        return [(zeros(shape, dtype=dtype, device=self.device), zeros(shape, dtype=dtype, device=self.device))
                for _ in range(mc.num_hidden_layers if num_layers is None else num_layers)]

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.kv_caches = self.new_kv_caches(num_blocks)
        self.graphs = self.capture_graphs(self.kv_caches)
        if self.device.type == "cuda" and self.config.attention_backend == "triton":
            from nextok.worker.warmup import warm_up

            log.info("compiled the eager steps' kernels in %.1f s", warm_up(self))

    def capture_graphs(self, kv_caches: list):
        """Decode-step CUDA graphs of this model over kv_caches (CUDA, triton, not eager), or None.
        Also a draft's own pool (spec/draft.py): the model runs one layer per cache given."""
        cfg = self.config
        if (self.device.type != "cuda" or cfg.attention_backend != "triton" or cfg.enforce_eager
                or cfg.cuda_graph_max_batch <= 0):
            return None
        from nextok.worker.cuda_graph import CudaGraphRunner

        max_batch = min(cfg.cuda_graph_max_batch, cfg.scheduler.max_num_seqs)
        max_blocks = -(-self.max_model_len // self.block_size)
        graphs = CudaGraphRunner(self.model, kv_caches, max_batch, max_blocks,
                                 cfg.model.sliding_window, self.device)
        try:
            graphs.capture()
            return graphs
        except RuntimeError as e:  # serve eagerly rather than not at all, and say so loudly
            log.warning("CUDA graph capture failed, decode runs eagerly (--enforce-eager "
                        "silences this): %s", e)
            return None

    def release(self, seq_ids) -> None:
        for sid in seq_ids:
            self.generators.pop(sid, None)

    # ---- one step ------------------------------------------------------------------------
    def execute(self, out: SchedulerOutput) -> ModelOutput:
        return self.collect(self.launch(out))

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput) -> LaunchedStep:
        """Queue the step's work on the device (model, logits, sampler, copies of the results
        to the host) without waiting for it. A PENDING input token is the previous launch's
        sampled token for that sequence, taken on the device."""
        # Single-token queries and verify steps first (one batched attention call over decode
        # rows), then multi-token chunks.
        items = sorted(out.scheduled, key=lambda s: s.num_new_tokens != 1 and not s.draft)
        host, prefills, sample_rows, sample_items, pending, verify = self._prepare(items)
        input_ids = self._input_ids(host["ids"], pending)
        n = len(host["ids"])
        if self.graphs is not None and self.graphs.fits(n, len(host["lens"]), len(prefills)):
            hidden = self.graphs.run(input_ids, host["pos"], host["slots"], host["tables"], host["lens"])
        else:
            positions, meta = self._device_inputs(host, prefills)
            hidden = self.model(input_ids, positions, self.kv_caches, meta)
        seqs = [it.seq for it in sample_items]
        self._last_sampled, self._last_rows = None, {}
        verified = {}
        if verify:  # verify steps: every row of each scores a draft token (synchronous)
            from nextok.spec.verify import verify_drafts

            rows = [r for _, item_rows in verify for r in item_rows]
            logits = self.model.compute_logits(hidden.index_select(0, self._to_device(rows)))
            verified = verify_drafts(logits, verify, [self._generator(it.seq) for it, _ in verify],
                                     self.sampler)
        last_hidden = self._last_hidden(hidden, sample_rows, sample_items, verify, verified)
        if not seqs:
            return LaunchedStep([], {}, verified=verified, hidden=last_hidden)
        if sample_rows != list(range(n)):
            hidden = hidden.index_select(0, self._to_device(sample_rows))
        logits = self.model.compute_logits(hidden)  # [S, V]
        res = self.sampler(logits, self._sampling_metadata(seqs, logits.shape[-1]))
        self._last_sampled, self._last_rows = res.sampled, {s.seq_id: i for i, s in enumerate(seqs)}
        results = {"sampled": res.sampled}
        if res.logprobs is not None:
            results["logprobs"] = res.logprobs
            if res.top_ids is not None:
                results.update(top_ids=res.top_ids, top_logprobs=res.top_logprobs)
        if self.device.type != "cuda":
            return LaunchedStep(seqs, results, verified=verified, hidden=last_hidden)
        results = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True).copy_(v, non_blocking=True)
                   for k, v in results.items()}
        done = torch.cuda.Event()
        done.record()
        return LaunchedStep(seqs, results, done, verified, last_hidden)

    def _last_hidden(self, hidden: torch.Tensor, sample_rows: list[int], sample_items: list,
                     verify: list, verified: dict) -> LastHidden | None:
        """hidden [T, hidden]: the step's rows -> the rows that gave each sequence's newest token
        (a verify step's row of its last accepted draft, or of its last token if none was)."""
        if not self.return_hidden or not (sample_items or verify):
            return None
        rows = list(sample_rows)
        seq_ids = [it.seq.seq_id for it in sample_items]
        positions = [it.start + it.num_new_tokens - 1 for it in sample_items]
        for it, item_rows in verify:
            accepted = len(verified[it.seq.seq_id]) - 1
            rows.append(item_rows[accepted])
            seq_ids.append(it.seq.seq_id)
            positions.append(it.start + accepted)
        return LastHidden(seq_ids, positions, hidden.index_select(0, self._to_device(rows)))

    def collect(self, step: LaunchedStep) -> ModelOutput:
        """Wait for a launched step's results and hand them over as Python values."""
        if step.done is not None:
            step.done.synchronize()
        if not step.seqs:
            return ModelOutput(sampled=dict(step.verified), hidden=step.hidden)
        res = {k: v.tolist() for k, v in step.results.items()}
        out = ModelOutput(sampled={s.seq_id: t for s, t in zip(step.seqs, res["sampled"])},
                          hidden=step.hidden)
        out.sampled.update(step.verified)
        if "logprobs" in res:
            top_ids, top_lps = res.get("top_ids"), res.get("top_logprobs")
            for i, s in enumerate(step.seqs):
                k = s.params.logprobs
                if k is None:
                    continue
                top = list(zip(top_ids[i][:k], top_lps[i][:k])) if top_ids and k else []
                out.logprobs[s.seq_id] = SeqLogprobs(res["logprobs"][i], top)
        return out

    def _sampling_metadata(self, seqs: list, vocab_size: int) -> SamplingMetadata:
        eos = self.config.model.eos_token_ids
        suppress = []
        for s in seqs:
            p = s.params
            early = s.num_output_tokens < p.min_tokens
            suppress.append(([] if p.ignore_eos else list(eos)) + p.stop_token_ids if early else [])
        history = any(s.params.needs_token_history for s in seqs)  # else skip the copies
        return SamplingMetadata.build(
            params=[s.params for s in seqs],
            prompt_token_ids=[s.prompt_token_ids for s in seqs] if history else None,
            output_token_ids=[s.output_token_ids for s in seqs] if history else None,
            generators=[self._generator(s) for s in seqs],
            suppress_token_ids=suppress, vocab_size=vocab_size, device=self.device)

    def _generator(self, seq) -> torch.Generator | None:
        seed = seq.params.seed
        if seed is None:
            return None
        gen = self.generators.get(seq.seq_id)
        if gen is None:
            # Sample i of an n > 1 request gets seed + i, so the n samples differ but repeat.
            gen = torch.Generator(device=self.device).manual_seed(seed + seq.index)
            self.generators[seq.seq_id] = gen
        return gen
