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

from . import exercises, explore, loading, peak, release, serve
from .arena import Arena, plan_arena, replay_naive_load, replay_planned
from .config import ConfigError, TinyVLMConfig, small_config
from .evaluate import image_task_correct
from .images import QUESTION_KINDS, make_image_tasks
from .model import TinyVLM
from .peak import measure_load_memory
from .plan import footprint, image_budget, parallel_options, param_counts, plan_cluster, plan_scaled, scaled_up
from .report import Day0Report, day0_report
from .operators import BASELINE_OPERATORS, UnsupportedOperatorError, register_operator, required_operators

__all__ = ["exercises", "explore", "loading", "peak", "release", "serve", "Arena", "plan_arena", "replay_naive_load",
           "replay_planned", "ConfigError", "TinyVLMConfig", "small_config", "image_task_correct", "QUESTION_KINDS",
           "make_image_tasks", "TinyVLM", "measure_load_memory", "footprint", "image_budget", "parallel_options",
           "param_counts", "plan_cluster", "plan_scaled", "scaled_up", "Day0Report", "day0_report",
           "BASELINE_OPERATORS", "UnsupportedOperatorError", "register_operator", "required_operators"]
