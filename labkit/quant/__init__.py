"""Lab 03, INT4 quantization (notebook 03): quantized tensors (symmetric and asymmetric, groups), nibble
packing, llama.cpp's block formats, NF4, quantized layers, whole-model precision policies and the settings
swept, the quality they keep (paired retention intervals), GPTQ, the INT4 matmul's speed and the verdicts a
busy machine cannot turn upside down, the fact-checks, the explorer and the exercises.

    qtensor    QTensor, quantize, quant_error, quantized_bytes     packing   pack_int4, unpack_int4
    formats    Q4_0 / Q4_1 / Q8_0, byte for byte                    nf4       NF4 levels and blocks
    linear     QuantLinear (reference and int4pack paths), QuantEmbedding
    policy     quantize_model, Setting, SETTINGS                    quality   retention, sweep, sensitivity,
    gptq       collect_inputs, gptq_quantize, gptq                            gptq_vs_rtn
    noise      paired differences over pieces of a text             threads   torch_threads
    speed      measure_matmuls -> MatmulRun (one method, timed in turns)
    kernels    the INT4 GEMV ladder, RUNGS (loops in kernels_jit)   kernels_speed  measure_ladder -> LadderRun
    verdicts   headline speed-up, all threads, memory-bound or not  factcheck the source's claims, checked
    explore    plots, widget, pooled SQNR                           exercises the notebook's exercises
    gguf       write_gguf: TinyLM as a llama-architecture GGUF file (F32, Q8_0, Q4_0) that llama.cpp reads
    sparse     2:4 structured sparsity: prune, compress (values + 2-bit indices), sparse matmul, tensor-core roofline
"""

from . import (exercises, explore, factcheck, formats, gptq, kernels, kernels_speed, nf4, noise, quality, sparse,
               speed, verdicts)
from .linear import QuantLinear
from .packing import pack_int4
from .gguf import write_gguf
from .policy import SETTINGS, quantize_model
from .qtensor import QTensor, quant_error, quantize, quantized_bytes
from .quality import retention

__all__ = ["exercises", "explore", "factcheck", "formats", "gptq", "kernels", "kernels_speed", "nf4", "noise",
           "quality", "sparse", "speed", "verdicts",
           "QuantLinear", "pack_int4", "SETTINGS", "quantize_model", "QTensor", "quant_error", "quantize",
           "quantized_bytes", "retention", "write_gguf"]
