"""Quantized linear layers behind one interface (`QuantMethod`), chosen by `--quantization`.

The model is built and loaded dense; the model runner then swaps each decoder linear for the
method's layer (`quantize_model`), before anything else binds to the weights. The lm_head and the
embedding stay dense, as in vLLM: they are read once per step and hold the logits' precision.
GGUF files that arrive quantized take their own path for now (kernels/cpu_gguf_linear.py,
`--no-gguf-blocks` turns it off); AWQ, GPTQ and FP8 are still to come (issue 7).
"""
from __future__ import annotations

from nextok.quant.base import QuantMethod, quantize_model
from nextok.quant.int8 import Int8WeightOnly

METHODS: dict[str, type[QuantMethod]] = {Int8WeightOnly.name: Int8WeightOnly}


def get_quant_method(name: str) -> QuantMethod:
    from nextok.errors import NextokError

    if name not in METHODS:
        raise NextokError(f"unknown --quantization {name!r}; known: {', '.join(sorted(METHODS))}")
    return METHODS[name]()


__all__ = ["METHODS", "QuantMethod", "get_quant_method", "quantize_model"]
