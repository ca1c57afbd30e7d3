"""Sharded loading: each tensor-parallel rank reads only its slices of only the shards that hold them, in
parallel threads, converting precision on the way, optionally into a pre-planned arena (notebook 07, section 3;
the service's ranks load with it at start-up).

    style        stored [out, in]      rank r of tp reads                                    on the ranks
    column       rows                  rows    r*out/tp .. (r+1)*out/tp                      wq wk wv w_gate w_up
    vocab        rows                  rows    r*vocab/tp ..                                 tok_emb (tied head)
    row          columns               columns r*in/tp .. (r+1)*in/tp                        wo w_down
    replicated   everything            the whole tensor                                      norms, q_norm, k_norm
    encoder      --                    nothing: load_encoder reads them for the engine       vision tower, projector

Reads go through `safetensors.safe_open(file, "pt").get_slice(name)[...]`: safetensors maps the file (a private
mmap) and returns a VIEW of the mapping, nothing read yet; the one copy that reads the slice's pages is the
conversion to `dtype` (into memory the rank owns) or, with an arena, the copy into the arena's slot. The operating
system reads whole pages, so a "row" slice (a few columns of every row) touches every page of its tensor unless
a row spans several pages: LoadStats.bytes_read is the bytes requested, labkit.day0.peak.measure_load_memory
what they cost.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.nn as nn
from safetensors import safe_open

from .._checks import check_choice, check_int, check_positive_int, fail
from ..parallel import tensor as parallel_tensor
from ..quant import QTensor, QuantLinear, quantize
from ..tinylm import rope_tables
from .model import LanguageModel, TinyVLM
from .release import Release, ReleaseError, read_release

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int4": "int4"}
INT4_STYLES = ("column", "row")
"""With dtype "int4" only the decoder's attention and MLP weights go INT4 (asymmetric, groups of 32 inputs, one
group per row when 32 does not divide a slice's inputs): labkit.quant's policy {"attention": "int4", "mlp":
"int4"}. The embedding (tied to the output layer, looked up by vocab-parallel rows) and the norms stay FP32."""
INT4_GROUP = 32


@dataclass(frozen=True)
class LoadStats:
    """What one load did: bytes_read, files opened (by name), tensors, wall seconds. bytes_read is COMPUTED
    from the slices' shapes: the bytes requested from the files, not a measurement. The operating system reads
    whole pages (4 KiB, and the kernel maps up to 64 KiB around a fault), so what is read can be more: a row
    slice of a row-major tensor touches every row's pages. measure_load_memory measures the file pages."""
    bytes_read: int
    files: tuple[str, ...]
    tensors: int
    seconds: float

    @property
    def files_opened(self) -> int:
        return len(self.files)


def as_release(folder) -> Release:
    """`folder` itself if it is a Release already read, else read_release(folder)."""
    return folder if isinstance(folder, Release) else read_release(folder)


def check_dtype(dtype) -> torch.dtype | str:
    """torch.float32, torch.bfloat16 or "int4" (their names accepted too)."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    if isinstance(dtype, torch.dtype) and dtype in (torch.float32, torch.bfloat16):
        return dtype
    fail("dtype", dtype, "torch.float32, torch.bfloat16 or 'int4'",
         ValueError if isinstance(dtype, (str, torch.dtype)) else TypeError)


def check_rank(release: Release, rank, tp) -> tuple[int, int]:
    """(rank, tp) if `tp` splits the decoder evenly (labkit.parallel's check) and 0 <= rank < tp."""
    tp = parallel_tensor.check_tp(release.config.text_config, check_positive_int("tp", tp))
    return check_int("rank", rank, 0, tp - 1), tp


def rank_slice(shape: tuple[int, ...], style: str, rank: int, tp: int) -> tuple[slice, ...]:
    """The index of rank `rank`'s part of a tensor of `shape` split by `style` (see the module docstring)."""
    check_choice("style", style, ("column", "vocab", "row", "replicated"))
    tp = check_positive_int("tp", tp)
    check_int("rank", rank, 0, tp - 1)
    if style == "replicated":
        return (slice(None),)
    dim = 1 if style == "row" else 0
    if len(shape) <= dim or shape[dim] % tp:
        fail("tp", tp, f"a divisor of dimension {dim} of a {style}-split tensor of shape {tuple(shape)}")
    n = shape[dim] // tp
    return (slice(None),) * dim + (slice(rank * n, (rank + 1) * n),)


def slice_bytes(shape: tuple[int, ...], spec: tuple[slice, ...], itemsize: int) -> int:
    """Bytes of tensor[spec] for a tensor of `shape` (spec from rank_slice)."""
    dims = [len(range(*s.indices(n))) for s, n in zip(spec, shape)] + list(shape[len(spec):])
    return math.prod(dims) * itemsize


def rank_tensors(release: Release, rank: int, tp: int) -> dict[str, tuple[str, tuple[slice, ...]]]:
    """{name: (file, index)} of every tensor rank `rank` of `tp` holds (the encoder's are not among them)."""
    rank, tp = check_rank(release, rank, tp)
    return {name: (release.tensors[name].file, rank_slice(release.tensors[name].shape, style, rank, tp))
            for name, style in release.plan.items() if style != "encoder"}


def _convert(t: torch.Tensor, dtype, style: str):
    """`t` (a view of the mapped file) in `dtype`, in memory the caller owns: ONE copy, which is the read
    ("int4": a labkit.quant QTensor for the big linear weights)."""
    if dtype == "int4" and style in INT4_STYLES:
        return quantize(t.float(), 4, "asym", INT4_GROUP if t.shape[1] % INT4_GROUP == 0 else "channel")
    target = torch.float32 if dtype == "int4" else dtype
    return t.to(target, copy=True, memory_format=torch.contiguous_format)


def _read(view: torch.Tensor, name: str, dtype, style: str, arena, placed: list[str], lock):
    """The tensor as loaded: without an arena a converted copy; with one, copied straight from the mapping
    into its slot, converted on the way (an INT4 QTensor part by part: name.codes, name.scale, name.zero).
    Each placed name is appended to `placed` (so that a failed load can undo it)."""
    if arena is None:
        return _convert(view, dtype, style)

    def put(key, value, target=None):
        out = arena.place(key, value, target)
        with lock:
            placed.append(key)
        return out
    if not (dtype == "int4" and style in INT4_STYLES):
        return put(name, view, torch.float32 if dtype == "int4" else dtype)
    q = _convert(view, dtype, style)
    zero = None if q.zero is None else put(name + ".zero", q.zero)
    return QTensor(put(name + ".codes", q.codes), put(name + ".scale", q.scale), zero, q.bits, q.group_size,
                   q.scheme, q.shape)


def read_tensors(release: Release, wanted: dict[str, tuple[str, tuple[slice, ...]]], dtype=torch.float32,
                 threads: int = 4, arena=None, styles: dict[str, str] | None = None) -> tuple[dict, LoadStats]:
    """Read `wanted` ({name: (file, index)}) from `release` with `threads` worker threads, opening each file
    named there once (all of them before the first read, so a file that cannot be opened fails the load before
    anything is placed), each one let go once its last tensor is read (its mapped pages stop counting); convert
    to `dtype`; place into `arena` when given (anything with place(name, tensor, dtype) -> view and
    discard(name): labkit.day0.arena.Arena). A read that fails names the file and tensor; the partial result is
    dropped and every placement already made is discarded, so the arena can take a retry."""
    dtype, threads = check_dtype(dtype), check_positive_int("threads", threads)
    if arena is not None and not all(callable(getattr(arena, m, None)) for m in ("place", "discard")):
        fail("arena", type(arena).__name__, "an object with place(name, tensor, dtype) -> tensor view and "
             "discard(name), or None", TypeError)
    styles = styles or {}
    t0 = time.perf_counter()
    order = sorted(wanted, key=lambda n: wanted[n][0])  # file by file: few files are open at once
    files = sorted({file for file, _ in wanted.values()})
    left = Counter(file for file, _ in wanted.values())
    handles, lock, placed = {}, threading.Lock(), []
    for f in files:
        try:
            handles[f] = safe_open(str(release.folder / f), "pt")
        except Exception as e:  # noqa: BLE001 (the library's own errors, reworded with the file)
            raise ReleaseError(f"{f}: cannot be opened ({type(e).__name__}: {e})") from None

    def one(name: str):
        file, spec = wanted[name]
        try:
            value = _read(handles[file].get_slice(name)[spec], name, dtype, styles.get(name, "replicated"), arena,
                          placed, lock)
        except Exception as e:  # noqa: BLE001
            raise ReleaseError(f"{file}: reading tensor {name!r} failed ({type(e).__name__}: {e})") from None
        with lock:
            left[file] -= 1
            if not left[file]:
                del handles[file]  # unmaps the file (once the last view of it is gone)
        return name, value

    pool = ThreadPoolExecutor(max_workers=threads)
    try:
        futures = [pool.submit(one, name) for name in order]
        out = dict(f.result() for f in futures)
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)  # no read still running when the placements are undone
        for key in placed:
            arena.discard(key)
        raise
    finally:
        pool.shutdown(wait=True)
    read = sum(slice_bytes(release.tensors[n].shape, spec, release.tensors[n].torch_dtype.itemsize)
               for n, (_, spec) in wanted.items())
    return {n: out[n] for n in wanted}, LoadStats(read, tuple(files), len(out), time.perf_counter() - t0)


def load_rank(folder, rank: int, tp: int, dtype=torch.float32, threads: int = 4, arena=None) -> tuple[dict, LoadStats]:
    """Rank `rank` of `tp`'s tensors ({name: tensor, or QTensor for INT4 linears}) and what the load did.
    `folder`: a release folder or a Release already read (read_release checks it whole first). With an `arena`
    (sized by placed_sizes) the tensors are views of it; a load that fails leaves the arena as it was."""
    release = as_release(folder)
    wanted = rank_tensors(release, rank, tp)
    return read_tensors(release, wanted, dtype, threads, arena, release.plan)


def placed_sizes(folder, rank: int, tp: int, dtype=torch.float32) -> dict[str, int]:
    """{name: bytes} load_rank will place for this rank (QTensor parts as name.codes / .scale / .zero), from
    the headers alone: what labkit.day0.arena.plan_arena needs before a byte is read."""
    release, dtype = as_release(folder), check_dtype(dtype)
    plan, sizes = release.plan, {}
    for name, (_, spec) in rank_tensors(release, rank, tp).items():
        shape = [len(range(*s.indices(n))) for s, n in zip(spec, release.tensors[name].shape)]
        shape += list(release.tensors[name].shape[len(spec):])
        if not (dtype == "int4" and plan[name] in INT4_STYLES):
            sizes[name] = math.prod(shape) * (torch.float32 if dtype == "int4" else dtype).itemsize
            continue
        q = _convert(torch.zeros(shape), dtype, plan[name])  # a slice-sized zero tensor (labkit.quant refuses meta)
        sizes.update({f"{name}.{k}": p.numel() * p.element_size()
                      for k, p in (("codes", q.codes), ("scale", q.scale), ("zero", q.zero)) if p is not None})
    return sizes


def load_encoder(folder, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """The vision tower's and the projector's tensors, whole (the engine runs the encoder beside the ranks)."""
    release = as_release(folder)
    if check_dtype(dtype) == "int4":
        fail("dtype", dtype, "torch.float32 or torch.bfloat16 (the encoder is not quantized)")
    wanted = {n: (release.tensors[n].file, (slice(None),)) for n, s in release.plan.items() if s == "encoder"}
    return read_tensors(release, wanted, dtype)[0]


def load_full(folder) -> dict[str, torch.Tensor]:
    """Every stored tensor, whole, in FP32: the single-process reference's weights."""
    release = as_release(folder)
    return read_tensors(release, {n: (t.file, (slice(None),)) for n, t in release.tensors.items()})[0]


def load_model(folder, operators: dict | None = None):
    """The whole TinyVLM in FP32 in this process: the single-process reference (notebook 07, the tests)."""
    release = as_release(folder)
    model = TinyVLM(release.config, operators)
    missing, _ = model.load_state_dict(load_full(release), strict=False)  # unexpected ones: read_release refused
    left = [n for n in missing if n != "language_model.lm_head.weight"]  # tied: the embedding's tensor
    if left:
        raise ReleaseError(f"{release.folder}: tensor {left[0]!r} was not loaded (not in the release)")
    return model.eval()


def build_rank_model(folder, rank: int, tp: int, dtype=torch.float32, threads: int = 4, arena=None):
    """Rank `rank` of `tp`'s part of the language model, ready for a TP rank: a labkit.parallel ShardedTinyLM
    (forward on every rank at once; full logits) whose local decoder holds only this rank's slices. The decoder
    is built on the meta device (no full-size weight is ever allocated), then takes the loaded tensors; INT4
    linears become labkit.quant QuantLinear layers."""
    release = as_release(folder)
    tensors, _ = load_rank(release, rank, tp, dtype, threads, arena)
    cfg = release.config.text_config
    with torch.device("meta"):
        local = LanguageModel(cfg)
    quantized = {}
    for name, value in tensors.items():
        path, _, leaf = name.removeprefix("language_model.").rpartition(".")
        if isinstance(value, QTensor):  # a shape-only stand-in until from_local has checked the shapes
            quantized[path], value = value, torch.empty(value.shape, device="meta")
        setattr(local.get_submodule(path), leaf, nn.Parameter(value, requires_grad=False))
    if cfg.tie_embeddings:
        local.lm_head.weight = local.tok_emb.weight
    float_dtype = torch.bfloat16 if dtype in (torch.bfloat16, "bfloat16") else torch.float32
    local.rope_cos, local.rope_sin = (t.to(float_dtype) for t in rope_tables(
        cfg.head_dim, cfg.max_seq_len, cfg.rope_theta))
    left = [n for n, p in [*local.named_parameters(), *local.named_buffers()]
            if p.is_meta and n.rpartition(".")[0] not in quantized]
    if left:
        raise ReleaseError(f"{release.folder}: tensor {left[0]!r} was not loaded (not in the release)")
    sharded = parallel_tensor.ShardedTinyLM.from_local(local.eval(), rank, tp)
    for path, q in quantized.items():  # the local product of its column- or row-parallel layer
        sharded.local.get_submodule(path).linear = QuantLinear(q, backend="reference")
    return sharded
