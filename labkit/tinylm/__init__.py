"""TinyLM, the course model, and everything around it: config and its table of linear layers, the model,
the KV-cache contract, generation, the corpus and tokenizer, checkpoints, training, evaluation and decode
traces (notebook 00; every later lab builds on it). Bottom layer: imports only labkit's own helpers."""

from .cache import BatchedCache, Cache, KVCache
from .checkpoint import CHECKPOINT, CheckpointError, load_pretrained, save_checkpoint
from .config import (LAYER_TYPES, TP_STYLES, LinearLayer, TinyLMConfig, iter_linears, layer_type, linear_layers,
                     check_tinylm, param_counts, random_config)
from . import corpus
from .corpus import TASK_KINDS, Task, make_tasks
from .eval import accuracy_gap, perplexity, task_accuracy, task_correct
from .generate import check_prompt, generate, sample
from .model import Attention, TinyLM, merge_embeds, rope_tables
from .tokenizer import ByteTokenizer
from .traces import Event, record_decode_trace

__all__ = ["BatchedCache", "Cache", "KVCache", "CHECKPOINT", "CheckpointError", "load_pretrained", "save_checkpoint", "LAYER_TYPES",
           "TP_STYLES", "LinearLayer", "TinyLMConfig", "iter_linears", "layer_type", "linear_layers", "param_counts",
           "random_config", "check_tinylm", "check_prompt", "TASK_KINDS", "Task", "corpus", "make_tasks", "accuracy_gap", "perplexity", "task_accuracy",
           "task_correct", "generate", "sample", "Attention", "TinyLM", "merge_embeds", "rope_tables", "ByteTokenizer", "Event", "record_decode_trace"]
