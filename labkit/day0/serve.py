"""Start-up for TinyVLM's release (notebook 07, section 5): what `python -m labkit.serving --model data/tinyvlm
--tp 2 --port P` runs. labkit.serving names this module in its MODEL_TYPES registry ("tinyvlm" ->
"labkit.day0.serve": engine_loader and processor_loader) and imports it only when a release of that type is served.

    API process                                engine-core process             rank r of tp (gloo, tp > 1)
    HTTP server listening at once: /health 503 "loading"
    Service(process=True) spawns ----------->  release_engine (engine_loader's
                                               picklable partial):
                                               1. TPRunner.from_builder(rank_model, (folder, ...))
                                                                     -->  rank_arena: ONE buffer planned from
                                                                          the headers (its slices, its KV pools,
                                                                          an activation reserve);
                                                                          build_rank_model(..., arena=) reads
                                                                          only its slices of only the shards
                                                                          that hold them into it; its
                                                                          ModelRunner's K/V pools are views of
                                                                          the arena's KV region (kv_pools)
                                               2. engine.warmup(): a one-token forward on every rank
                               <-------------  Ready(pid)
    processor_loader: vision tower + projector (the language model never allocated) behind an EncoderCache;
      the VLMProcessor (the service's processor thread runs it)
    /health 200 "ready"; image features go down the pipe inside AddRequest (by value), tokens come back in Outputs

tp = 1 needs no ranks: the decoder is rank 0 of 1 (every slice the whole tensor, the same arena), in this
process (the engine process). The activation reserve is the footprint's (labkit.day0.plan): planned room, which
PyTorch's CPU allocator does not use (it allocates activations itself); on a device the arena would be all there
is. A rank that fails to load (a truncated shard, ...) raises RankError naming the rank and the cause; the Pool has
ended the group (no rank outlives it), the engine process says Failed with that error, /health says "failed", and
`python -m labkit.serving` exits with code 1.
check_release runs first, in parse_args: config.json parses, the folder is a release and --tp divides the
decoder (exit 2 otherwise); the shards themselves are read by the ranks.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import torch

from .._checks import check_choice, check_positive, check_positive_int, check_type
from ..parallel import tensor
from ..serving import Engine, EngineConfig, ModelRunner, tp as serving_tp
from ..tinylm import ByteTokenizer
from .arena import Arena, plan_arena
from .config import TinyVLMConfig
from .loading import as_release, build_rank_model, load_encoder, placed_sizes
from .model import TinyVLM
from .multimodal import EncoderCache, VLMProcessor
from .plan import footprint
from .release import CONFIG, INDEX, SINGLE, ReleaseError

ENCODER_CACHE_IMAGES = 64
"""Images whose features the service keeps (EncoderCache capacity)."""
RANK_TIMEOUT_S = 60.0
"""Seconds a rank may take to load its slices (and each collective later) before the group is ended."""
KV_DTYPE = torch.float32
"""The KV pools' dtype (lab 06's ModelRunner default), whatever the weights' precision."""
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


class ReleaseTokenizer(ByteTokenizer):
    """TinyVLM's tokenizer: bytes are ids 0..255 as TinyLM's; the special ids (256.., the image placeholder
    among them) decode to no text, so a sampled special id never breaks a stream."""

    def decode_bytes(self, ids) -> bytes:
        return super().decode_bytes([i for i in ids if not (isinstance(i, int) and i >= 256)])


def check_release(folder, tp: int) -> TinyVLMConfig:
    """The config of the release in `folder`, checked cheaply before the service starts: config.json parses
    (ConfigError names the field), the folder holds an index or a single model.safetensors, and `tp` divides
    the decoder (heads, KV heads, d_ff, vocabulary). ReleaseError / ValueError say which."""
    check_type("folder", folder, (str, Path), "a release folder (str or Path)")
    folder = Path(folder)
    if not (folder / CONFIG).is_file():
        raise ReleaseError(f"{folder}: not a release ({CONFIG} is missing)")
    try:
        cfg = TinyVLMConfig.from_dict(json.loads((folder / CONFIG).read_text()))
    except json.JSONDecodeError as e:
        raise ReleaseError(f"{CONFIG}: not valid JSON ({e})") from None
    if not ((folder / INDEX).is_file() or (folder / SINGLE).is_file()):
        raise ReleaseError(f"{folder}: not a release (neither {INDEX} nor {SINGLE} is there)")
    tensor.check_tp(cfg.text_config, tp)
    return cfg


def kv_shape(cfg: TinyVLMConfig, tp: int, num_blocks: int, block_size: int) -> tuple[int, int, int, int]:
    """One rank's K (or V) pool: [n_layers, n_kv_heads / tp, num_blocks * block_size, head_dim]."""
    t = cfg.text_config
    return t.n_layers, t.n_kv_heads // tp, num_blocks * block_size, t.head_dim


def rank_arena(folder, rank: int, tp: int, dtype: str, num_blocks: int, block_size: int, max_num_seqs: int,
               max_num_batched_tokens: int | None = None) -> Arena:
    """Rank `rank` of `tp`'s arena, planned before a byte is read: its slices as placed (placed_sizes, from
    the headers), then its K and V pools (kv_shape, KV_DTYPE), then the footprint's activations for
    max_num_seqs sequences (labkit.day0.plan.footprint at the weights' precision)."""
    release = as_release(folder)
    kv = 2 * math.prod(kv_shape(release.config, tp, num_blocks, block_size)) * KV_DTYPE.itemsize
    act = footprint(release.config, DTYPE_BYTES[dtype], max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                    tp=tp)["activations"]
    return Arena(plan_arena(placed_sizes(release, rank, tp, dtype), kv, act))


def kv_pools(arena: Arena, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V pools as views of the arena's KV region, zeroed (what ModelRunner allocates otherwise)."""
    region = arena.kv_region().view(KV_DTYPE).zero_()  # [2 * L * H * S * D]
    k, v = region.view(2, *shape).unbind(0)  # each [L, H, S, D], contiguous
    return k, v


def rank_model(rank: int, world: int, folder: str, dtype: str, num_blocks: int, block_size: int,
               max_num_seqs: int, max_num_batched_tokens: int | None = None):
    """On TP rank `rank`: its shard of the decoder, read from the files by this rank into its arena
    (rank_arena, build_rank_model(..., arena=)); the shard carries `kv_pools` (views of the arena, which
    ModelRunner takes) and its local decoder `arena`."""
    release = as_release(folder)
    arena = rank_arena(release, rank, world, dtype, num_blocks, block_size, max_num_seqs, max_num_batched_tokens)
    sharded = build_rank_model(release, rank, world, dtype, arena=arena)
    sharded.kv_pools = kv_pools(arena, kv_shape(release.config, world, num_blocks, block_size))
    sharded.local.arena = arena
    return sharded


def encoder_model(folder, cfg: TinyVLMConfig) -> TinyVLM:
    """A TinyVLM whose vision tower and projector hold the release's weights (load_encoder) and whose language
    model stays on the meta device (never allocated): its encode_images is the service's encoder."""
    with torch.device("meta"):
        model = TinyVLM(cfg)
    missing, unexpected = model.load_state_dict(load_encoder(folder), strict=False, assign=True)
    left = [n for n in missing if not n.startswith("language_model.")]
    if left or unexpected:
        raise ReleaseError(f"{folder}: encoder tensor {(left or unexpected)[0]!r} "
                           f"{'was not loaded' if left else 'is not the model'}")
    return model.eval()


def release_engine(folder, tp: int = 1, dtype: str = "float32", timeout: float = RANK_TIMEOUT_S,
                   config: EngineConfig | None = None, threads: int | None = None, **options) -> Engine:
    """The Engine serving the release in `folder`'s decoder (see the module docstring): in `dtype` over `tp` gloo
    ranks that each load their own slices (tp 1: in this process); `timeout`: seconds a rank may take to load
    (and each collective); torch on `threads` threads (None: as it is). config / options: the Engine's
    (EngineConfig); its resolved pool, max_num_seqs and token budget also size each rank's arena. Picklable with
    functools.partial: what the service's engine process builds (engine_loader). Close the ranks with
    engine.close()."""
    cfg = check_release(folder, tp)
    check_positive("timeout", timeout, unit="seconds")
    check_choice("dtype", dtype, ("float32", "bfloat16"))
    if threads is not None:
        torch.set_num_threads(check_positive_int("threads", threads, "threads"))
    config = EngineConfig.build(config, **options).resolve(cfg.text_config)
    sizes = (config.num_blocks, config.block_size, config.max_num_seqs, config.max_num_batched_tokens)
    if tp == 1:
        shard = rank_model(0, 1, str(folder), dtype, *sizes)
        return Engine(runner=ModelRunner(shard.local, config.num_blocks, config.block_size, pools=shard.kv_pools),
                      config=config)
    return serving_tp.built_tp_engine(rank_model, (str(folder), dtype, *sizes), cfg.text_config, tp,
                                      timeout=timeout, config=config)


def release_processor(folder) -> tuple[VLMProcessor, ReleaseTokenizer]:
    """The release's (processor, tokenizer), which serve in the API process: the vision encoder (FP32, the
    language model never allocated) behind an EncoderCache of ENCODER_CACHE_IMAGES images."""
    cfg = check_release(folder, 1)
    cache = EncoderCache(encoder_model(folder, cfg).encode_images, ENCODER_CACHE_IMAGES, cfg.vision_config.image_size)
    return VLMProcessor(None, cfg, cache), ReleaseTokenizer()


def build_engine(folder, tp: int = 1, dtype: str = "float32", timeout: float = RANK_TIMEOUT_S,
                 config: EngineConfig | None = None, **options) -> tuple[Engine, VLMProcessor, ReleaseTokenizer]:
    """(engine, processor, tokenizer) in this process (notebook 07, the tests): release_engine's engine and
    release_processor's pair. Close the ranks with engine.close()."""
    engine = release_engine(folder, tp, dtype, timeout, config, **options)
    try:
        return (engine, *release_processor(folder))
    except BaseException:
        engine.close()
        raise


def engine_loader(args, config: EngineConfig):
    """labkit.serving's entry for model_type "tinyvlm" (its MODEL_TYPES): checks the release and --tp now (parse
    time, exit 2) and returns the picklable load() the service's engine process runs (release_engine, FP32, on
    --threads threads)."""
    folder, tp = Path(args.model).resolve(), args.tp  # the ranks get an absolute path
    check_release(folder, tp)
    return functools.partial(release_engine, folder, tp, "float32", RANK_TIMEOUT_S, config, args.threads)


def processor_loader(args) -> tuple[VLMProcessor, ReleaseTokenizer]:
    """labkit.serving's other entry: the (processor, tokenizer) the API process serves with (release_processor)."""
    return release_processor(Path(args.model).resolve())
