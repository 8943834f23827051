"""Quantized linear layers behind one interface (`QuantMethod`), chosen by `--quantization`.

The model is built and loaded dense; the model runner then swaps each decoder linear for the
method's layer (`quantize_model`), before anything else binds to the weights. The lm_head and the
embedding stay dense, as in vLLM: they are read once per step and hold the logits' precision.
GGUF files that arrive quantized take their own path for now (kernels/cpu_gguf_linear.py on CPU,
quant/gguf_cuda.py on CUDA; `--no-gguf-blocks` turns it off); AWQ and GPTQ checkpoints arrive
quantized (model/awq.py, model/gptq.py).

- int8: weight-only, one symmetric scale per output channel (quant/int8.py);
- int4: weight-only round-to-nearest, asymmetric, groups of 128 (quant/int4.py), the baseline
  AWQ and GPTQ must beat;
- fp8: W8A8 e4m3 with per-channel weight and per-token activation scales, on GPUs with FP8
  tensor cores (quant/fp8.py).
"""
from __future__ import annotations

from nextok.quant.base import QuantMethod, quantize_model
from nextok.quant.fp8 import FP8
from nextok.quant.int4 import Int4RoundToNearest
from nextok.quant.int8 import Int8WeightOnly

METHODS: dict[str, type[QuantMethod]] = {m.name: m for m in (Int8WeightOnly, Int4RoundToNearest, FP8)}


def get_quant_method(name: str, group_size: int = 128) -> QuantMethod:
    from nextok.errors import NextokError

    if name not in METHODS:
        raise NextokError(f"unknown --quantization {name!r}; known: {', '.join(sorted(METHODS))}")
    return Int4RoundToNearest(group_size) if name == Int4RoundToNearest.name else METHODS[name]()


__all__ = ["METHODS", "QuantMethod", "get_quant_method", "quantize_model"]
