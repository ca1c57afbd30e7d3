"""TinyLM, the course model, and everything around it: config and its table of linear layers, the model,
the KV-cache contract, generation, the corpus and tokenizer, the release (Hugging Face Llama layout), training,
evaluation and decode traces (notebook 00; every later lab builds on it). Bottom layer: imports only labkit's own
helpers."""

from . import corpus
from .cache import Cache, KVCache
from .checkpoint import load_pretrained, read_config
from .config import LAYER_TYPES, TinyLMConfig, check_tinylm, iter_linears, layer_type, linear_layers, param_counts
from .corpus import TASK_KINDS, Task, make_tasks
from .eval import accuracy_gap, perplexity, task_accuracy, task_correct
from .generate import check_prompt, generate
from .header import SAFETENSORS_DTYPES, HeaderError, TensorInfo, read_header
from .model import Attention, TinyLM, compile_blocks_apart, rope_tables, run_blocks
from .tokenizer import ByteTokenizer
from .traces import Event, record_decode_trace

__all__ = ["corpus", "Cache", "KVCache", "load_pretrained", "read_config", "LAYER_TYPES",
           "TinyLMConfig", "check_tinylm", "iter_linears", "layer_type", "linear_layers", "param_counts", "TASK_KINDS",
           "Task", "make_tasks", "accuracy_gap", "perplexity", "task_accuracy", "task_correct", "check_prompt",
           "generate", "SAFETENSORS_DTYPES", "HeaderError", "TensorInfo", "read_header",
           "Attention", "TinyLM", "compile_blocks_apart", "rope_tables", "run_blocks", "ByteTokenizer",
           "Event", "record_decode_trace"]
