"""Lab 03, INT4 quantization: quantized tensors (symmetric and asymmetric, groups), nibble packing,
llama.cpp's block formats and NF4, quantized layers and whole-model policies, GPTQ, and the explorer."""

from . import explore, formats, gptq, linear, qtensor
from .linear import QuantEmbedding, QuantLinear, quantize_model
from .qtensor import QTensor, pack_int4, quant_error, quantize, quantized_bytes, unpack_int4

__all__ = ["explore", "formats", "gptq", "linear", "qtensor", "QuantEmbedding", "QuantLinear", "quantize_model",
           "QTensor", "pack_int4", "quant_error", "quantize", "quantized_bytes", "unpack_int4"]
