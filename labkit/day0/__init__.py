"""Lab 07, the capstone (notebook 07_day0): adapt a model released today, TinyVLM, with every earlier lab.

    config      TinyVLMConfig (config.json: text_config + vision_config), TextConfig, VisionConfig
    model       TinyVLM: ViT vision tower, LLaVA projector, TinyLM decoder with QK-norm; tp_plan
    operators   the runtime's operator table, required_operators, check_operators, register_operator
    images      the course's images (Pillow, from a seed) and the questions about them
    evaluate    exact-match accuracy on image questions; TinyLM's text measures on the decoder
    train       `python -m labkit.day0.train`: TinyVLM from TinyLM, written as a release to data/tinyvlm/
    release     the Hugging Face-style release: write_release, read_release (checked from the headers alone),
                huggingface_hub's shard split, ReleaseError naming the file, tensor or field
    loading     each rank reads only its slices: load_rank (threads, BF16/INT4, arena), build_rank_model,
                load_encoder, load_full / load_model (the single-process reference)
    peak        measure_load_memory: a rank's peak memory, slices against whole tensors, in a fresh process
                (anonymous and file-backed)
    multimodal  image_hash (the pixels), decode_image_url (base64 data URLs only, size limits), EncoderCache
                (the encoder once per distinct image), VLMProcessor (TinyVLM's chat template -> token ids + images)
    serve       check_release, build_engine, engine_loader: `python -m labkit.serving --model data/tinyvlm --tp 2`
                (labkit.serving's MODEL_TYPES names it); ranks load their own slices, the encoder runs beside
    plan        the footprint (lab 01's tools + QK-norm and the vision tower), the image-token budget as vLLM's
                profiler reserves it, tensor-parallel divisibility, lab 04's planner on 2 devices and scaled up
    arena       a pre-planned, aligned device arena (weights, KV pools, activation reserve; discard undoes a
                placement); fragmentation replays on lab 02's allocator
    report      the Day-0 report: each line names the earlier lab it comes from
    explore     the notebook's figures and widget (shard map, bytes per rank, fragmentation timeline, TTFT)
    exercises   QK_NORM, RANK_PART, BLOCK_KEYS
"""

from . import (arena, config, evaluate, exercises, explore, images, loading, model, multimodal, operators, peak,
               plan, release, report, serve)

from .arena import Arena, ArenaPlan, LoadReplay, plan_arena, replay_naive_load, replay_planned
from .config import ConfigError, TextConfig, TinyVLMConfig, VisionConfig, small_config
from .evaluate import image_accuracy, image_task_correct, task_tokens, text_quality
from .images import COLOURS, QUESTION_KINDS, SHAPES, ImageTask, Scene, draw, make_image_tasks, to_pixels
from .model import TinyVLM, tp_plan
from .release import Release, ReleaseError, TensorInfo, parse_size, read_release, split_into_shards, write_release
from .loading import (LoadStats, build_rank_model, load_encoder, load_full, load_model, load_rank, placed_sizes,
                      rank_tensors)
from .peak import LoadPeak, measure_load_memory, measure_load_peak
from .multimodal import (MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, EncoderCache, VLMProcessor, decode_image_url,
                         image_hash)
from .serve import build_engine, check_release
from .plan import (check_parallel, footprint, image_budget, param_counts, parallel_options, plan_cluster,
                   plan_scaled, scaled_up)
from .report import Day0Report, day0_report
from .operators import (BASELINE_OPERATORS, OPERATORS, UnsupportedOperatorError, check_operators, qk_norm,
                        register_operator, required_operators)

__all__ = ["arena", "config", "evaluate", "exercises", "explore", "images", "loading", "model", "multimodal",
           "operators", "peak", "plan", "release", "report", "serve", "build_engine", "check_release", "MAX_IMAGE_BYTES", "MAX_IMAGE_PIXELS", "EncoderCache", "VLMProcessor", "decode_image_url", "image_hash", "Release", "ReleaseError", "TensorInfo", "parse_size", "read_release", "split_into_shards", "write_release",
           "LoadPeak", "LoadStats", "build_rank_model", "load_encoder", "load_full", "load_model", "load_rank", "measure_load_memory", "measure_load_peak", "placed_sizes",
           "rank_tensors", "Arena", "ArenaPlan", "LoadReplay", "plan_arena", "replay_naive_load", "replay_planned", "check_parallel",
           "footprint", "image_budget", "param_counts", "parallel_options", "plan_cluster", "plan_scaled", "scaled_up",
           "Day0Report", "day0_report", "ConfigError", "TextConfig", "TinyVLMConfig", "VisionConfig", "small_config", "image_accuracy",
           "image_task_correct", "task_tokens", "text_quality", "COLOURS", "QUESTION_KINDS", "SHAPES", "ImageTask",
           "Scene", "draw", "make_image_tasks", "to_pixels", "TinyVLM", "tp_plan", "BASELINE_OPERATORS", "OPERATORS",
           "UnsupportedOperatorError", "check_operators", "qk_norm", "register_operator", "required_operators"]
