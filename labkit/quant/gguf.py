"""TinyLM as a llama.cpp GGUF file, written with lab 03's own block formats (notebook 03).

    write_gguf(model, "tinylm-q8_0.gguf", "Q8_0")      qtype "F32", "Q8_0" or "Q4_0"

The file, GGUF version 3 (ggml's docs/gguf.md), little-endian:

    "GGUF" | version u32 = 3 | tensor count u64 | key-value count u64
    key-values    key (u64 byte length + UTF-8) | value type u32 | value     (an array: item type u32, count u64, items)
    tensor infos  name | n_dims u32 | dims u64 each, innermost first | ggml type u32 | offset u64 into the data
    zero padding to 32 bytes | the tensors, each starting at a multiple of 32 bytes

A TinyLM weight [out, in] is stored with dims (in, out): rows of `in` values, each row cut into 32-value
blocks (formats.py). Tensor names and types, in llama.cpp's convention:

    TinyLM (.weight)          GGUF (.weight)       F32   Q8_0  Q4_0
    tok_emb                   token_embd           F32   Q8_0  Q4_0, Q8_0 when tied (it is the output too)
    layers.N.attn_norm        blk.N.attn_norm      F32   F32   F32
    layers.N.attn.wq, wk      blk.N.attn_q, attn_k F32   Q8_0  Q4_0   rows permuted for llama.cpp's RoPE
    layers.N.attn.wv, wo      blk.N.attn_v, attn_output            same as attn_q
    layers.N.mlp_norm         blk.N.ffn_norm       F32   F32   F32
    layers.N.mlp.w_gate, ...  blk.N.ffn_gate, ffn_up, ffn_down     same as attn_q
    norm                      output_norm          F32   F32   F32
    lm_head (untied only)     output               F32   Q8_0  Q8_0

Which tensors are quantized follows llama.cpp. Norm weights (1-D) stay F32, as its converter keeps them
(convert_hf_to_gguf.py, prepare_tensors: n_dims <= 1 or "_norm.weight" -> F32). Q8_0 quantizes every matrix,
token_embd included, as `convert_hf_to_gguf.py --outtype q8_0` does. Q4_0 follows `llama-quantize ... Q4_0`
(src/llama-quant.cpp, llama_tensor_get_type): the output matrix, or token_embd when it doubles as the
output, gets Q6_K, which falls back to Q8_0 when its rows are not a multiple of 256 values (TinyLM's 128);
labkit has no Q6_K, so Q8_0 always. An untied token_embd is only looked up, one row per token: Q4_0.

The tokenizer is GPT-2's byte-level BPE with no merges (tokenizer.ggml.model "gpt2"): llama.cpp maps each
byte of the text to one character of GPT-2's byte alphabet (byte_symbols) and looks it up; with no merges
every byte stays its own token, and the vocabulary lists those 256 characters in byte order, so token id =
byte value, exactly TinyLM's ByteTokenizer. Documents in TinyLM's corpus end in "\\n", so "\\n" (10) is the
end-of-text token (llama.cpp stops there) and the beginning-of-text token too, never added to a prompt.
"""

from __future__ import annotations

import os
import struct
import tempfile
from enum import IntEnum
from pathlib import Path

import numpy as np
import torch.nn as nn

from .._checks import check_type, fail
from ..tinylm import ByteTokenizer, check_tinylm
from . import formats
from .qtensor import check_word

QTYPES = ("F32", "Q8_0", "Q4_0")
GGML_TYPE = {"F32": 0, "Q4_0": 2, "Q8_0": 8}  # ggml.h enum ggml_type
FILE_TYPE = {"F32": 0, "Q4_0": 2, "Q8_0": 7}  # llama.h enum llama_ftype: ALL_F32, MOSTLY_Q4_0, MOSTLY_Q8_0
QUANTIZE = {"Q8_0": formats.quantize_q8_0, "Q4_0": formats.quantize_q4_0}
ALIGNMENT = 32  # bytes; GGUF's default (general.alignment not written)
# llama.cpp names the pre-tokenizer (the regex split before BPE). With no merges any split leaves one token per
# byte; "smollm" (a small Llama with a byte-level BPE) is one whose detokenizer keeps the text as it is:
# "gpt-2" and "default" turn on clean_spaces, which drops the space in " ?" (TinyLM's recall prompts have it).
PRE_TOKENIZER = "smollm"



class GGUFValueType(IntEnum):
    """A metadata value's type code (gguf.md: gguf_metadata_value_type; gguf-py's GGUFValueType), the ones used."""
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9


_PACK = {GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.FLOAT32: "<f",
         GGUFValueType.BOOL: "<?"}


def byte_symbols() -> list[str]:
    """GPT-2's byte alphabet: the character byte-level BPE writes for each byte value 0..255. Printable
    Latin-1 bytes ("!".."~", "¡".."¬", "®".."ÿ") stand for themselves; the other 68 (controls, space,
    DEL, NBSP, soft hyphen) take U+0100, U+0101, ... in byte order, so " " is "Ġ" and "\\n" is "Ċ"."""
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, moved = [], 0
    for b in range(256):
        out.append(chr(b) if b in keep else chr(0x100 + moved))
        moved += b not in keep
    return out


def rope_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Rows of a query or key projection [n_heads * head_dim, in] reordered from TinyLM's half-split RoPE to
    llama.cpp's interleaved one; within each head, new row 2i = old row i, new row 2i + 1 = old row i + hd/2.

    TinyLM (like Hugging Face Llama) rotates the pair (i, i + hd/2) of each head by angle pos * theta^(-2i/hd);
    llama.cpp's llama architecture (LLAMA_ROPE_TYPE_NORM, ggml_rope) rotates the neighbours (2i, 2i + 1) by the
    same angle. Moving row i to 2i and row i + hd/2 to 2i + 1 makes its rotation act on the same numbers, and
    q.k is unchanged when q and k are permuted alike. Meta's original Llama used the interleaved layout;
    transformers' convert_llama_weights_to_hf.py permutes it to half-split, and llama.cpp's
    convert_hf_to_gguf.py (LlamaModel.permute, on q_proj with n_head and on k_proj with n_head_kv) undoes it:
    this function is that undo, for one projection with `n_heads` heads."""
    rows = w.shape[0]
    if rows % n_heads or (rows // n_heads) % 2:
        raise ValueError(f"w must have n_heads ({n_heads}) heads of an even width, got shape {w.shape}")
    half = rows // n_heads // 2
    return w.reshape(n_heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tensor_plan(model, qtype: str) -> list[tuple[str, str, str]]:
    """(GGUF name, TinyLM parameter name, qtype of the stored tensor) for every tensor of the file, in order
    (see the module docstring's table). Checks `model` and `qtype` as write_gguf does."""
    cfg = _check_model(check_tinylm(model))
    check_word("qtype", qtype, QTYPES)
    big = "F32" if qtype == "F32" else "Q8_0"  # the output matrix (llama-quantize's Q6_K, see the docstring)
    plan = [("token_embd.weight", "tok_emb.weight", big if qtype == "Q4_0" and cfg.tie_embeddings else qtype)]
    for i in range(cfg.n_layers):
        p, b = f"layers.{i}.", f"blk.{i}."
        plan += [(b + "attn_norm.weight", p + "attn_norm.weight", "F32")]
        plan += [(b + g + ".weight", p + t + ".weight", qtype) for g, t in
                 (("attn_q", "attn.wq"), ("attn_k", "attn.wk"), ("attn_v", "attn.wv"), ("attn_output", "attn.wo"))]
        plan += [(b + "ffn_norm.weight", p + "mlp_norm.weight", "F32")]
        plan += [(b + g + ".weight", p + t + ".weight", qtype) for g, t in
                 (("ffn_gate", "mlp.w_gate"), ("ffn_up", "mlp.w_up"), ("ffn_down", "mlp.w_down"))]
    plan += [("output_norm.weight", "norm.weight", "F32")]
    if not cfg.tie_embeddings:
        plan += [("output.weight", "lm_head.weight", big)]
    if qtype != "F32":
        widths = {cfg.d_model, cfg.d_ff}  # every matrix's row length (token_embd's too)
        if any(w % formats.BLOCK for w in widths):
            fail("model", f"d_model={cfg.d_model}, d_ff={cfg.d_ff}", f"a TinyLM whose d_model and d_ff are "
                 f"multiples of {formats.BLOCK} (the {qtype} block), or qtype 'F32'")
    return plan


def metadata(cfg, qtype: str) -> list[tuple[str, GGUFValueType, object]]:
    """The key-values of the file: (key, GGUF value type, value); an array's value is (item type, items)."""
    V = GGUFValueType
    return [
        ("general.architecture", V.STRING, "llama"),
        ("general.name", V.STRING, "TinyLM"),
        ("general.file_type", V.UINT32, FILE_TYPE[qtype]),
        ("general.quantization_version", V.UINT32, 2),  # ggml's GGML_QNT_VERSION: the Q4_0/Q8_0 layouts of today
        ("llama.vocab_size", V.UINT32, cfg.vocab_size),
        ("llama.context_length", V.UINT32, cfg.max_seq_len),
        ("llama.embedding_length", V.UINT32, cfg.d_model),
        ("llama.block_count", V.UINT32, cfg.n_layers),
        ("llama.feed_forward_length", V.UINT32, cfg.d_ff),
        ("llama.attention.head_count", V.UINT32, cfg.n_heads),
        ("llama.attention.head_count_kv", V.UINT32, cfg.n_kv_heads),
        ("llama.rope.freq_base", V.FLOAT32, cfg.rope_theta),
        ("llama.rope.dimension_count", V.UINT32, cfg.head_dim),
        ("llama.attention.layer_norm_rms_epsilon", V.FLOAT32, cfg.norm_eps),
        ("tokenizer.ggml.model", V.STRING, "gpt2"),
        ("tokenizer.ggml.pre", V.STRING, PRE_TOKENIZER),
        ("tokenizer.ggml.tokens", V.ARRAY, (V.STRING, byte_symbols())),
        ("tokenizer.ggml.token_type", V.ARRAY, (V.INT32, [1] * 256)),  # 1: LLAMA_TOKEN_TYPE_NORMAL
        ("tokenizer.ggml.merges", V.ARRAY, (V.STRING, [])),  # llama.cpp requires the key; none: one token per byte
        ("tokenizer.ggml.bos_token_id", V.UINT32, ByteTokenizer.eos_id),
        ("tokenizer.ggml.eos_token_id", V.UINT32, ByteTokenizer.eos_id),
        ("tokenizer.ggml.add_bos_token", V.BOOL, False),
        ("tokenizer.ggml.add_eos_token", V.BOOL, False),
    ]


def write_gguf(model, path, qtype: str) -> Path:
    """Write `model` (a float TinyLM with the byte tokenizer) to `path` as a llama-architecture GGUF file whose
    matrices are stored as `qtype` ("F32", "Q8_0" or "Q4_0"; norms stay F32), and return the path. The file is
    written under a temporary name in the same folder and renamed when complete: a failure leaves no file
    and an existing file at `path` untouched; an OSError names `path`. The file's mode follows the umask
    (0o644 under 0o022), as open() would give it."""
    plan = tensor_plan(model, qtype)
    path = Path(check_type("path", path, (str, os.PathLike), "a file path (str or pathlib.Path)"))
    if not path.parent.is_dir():
        fail("path", str(path), f"a file in an existing folder (no folder {path.parent})", FileNotFoundError)
    if path.is_dir():
        fail("path", str(path), "a file path, not a folder")
    state = model.state_dict()
    shapes = [tuple(state[name].shape) for _, name, _ in plan]
    sizes = [_nbytes(shape, q) for shape, (_, _, q) in zip(shapes, plan)]
    header = _header(metadata(model.cfg, qtype), plan, shapes, sizes)
    try:  # a short temporary name: a path whose own name is at the file system's limit still fits
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".gguf-", suffix=".tmp")
    except OSError as e:
        fail("path", str(path), f"a file in a folder this process can write ({e.strerror})", type(e))
    try:
        with os.fdopen(fd, "wb") as f:
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would outlive the rename: the user's umask decides
            f.write(header)
            for (gguf_name, name, q), size in zip(plan, sizes):
                data = _tensor_bytes(state[name], gguf_name, name, q, model.cfg)
                assert len(data) == size, (gguf_name, len(data), size)
                f.write(data + bytes(_pad(size)))
        os.replace(tmp, path)
    except BaseException as e:
        os.unlink(tmp)
        if isinstance(e, OSError):
            fail("path", str(path), f"a file this process can write ({e.strerror})", type(e))
        raise
    return path


def _umask() -> int:
    """The process's file-mode creation mask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _check_model(model: nn.Module):
    """The config of a TinyLM that a llama GGUF can hold: byte vocabulary, plain float weights, nothing else."""
    cfg = model.cfg
    if cfg.vocab_size != 256:
        fail("model", f"vocab_size={cfg.vocab_size}", "a TinyLM with vocab_size 256 (the byte tokenizer)")
    expected = {"tok_emb.weight", "norm.weight"} | {f"layers.{i}.{m}.weight" for i in range(cfg.n_layers) for m in
                                                     ("attn_norm", "attn.wq", "attn.wk", "attn.wv", "attn.wo",
                                                      "mlp_norm", "mlp.w_gate", "mlp.w_up", "mlp.w_down")}
    expected |= set() if cfg.tie_embeddings else {"lm_head.weight"}
    found = set(model.state_dict())
    if cfg.tie_embeddings:
        found.discard("lm_head.weight")
    if found != expected:  # these parameters are missing or extra
        fail("model", sorted(found ^ expected)[:4], "a float TinyLM with exactly TinyLM's parameters (a quantized "
             "copy or an extended model differs in these)")
    return cfg


def _tensor_bytes(param, gguf_name: str, name: str, qtype: str, cfg) -> bytes:
    """The stored bytes of one tensor: float32, Q/K rows permuted (rope_permute), quantized when asked."""
    w = param.detach().float().cpu().numpy()
    if not np.isfinite(w).all():
        fail("model", f"NaN or inf in {name}", "a TinyLM with finite weights")
    if gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
        w = rope_permute(w, cfg.n_heads if "attn_q" in gguf_name else cfg.n_kv_heads)
    if qtype == "F32":
        return np.ascontiguousarray(w, dtype="<f4").tobytes()
    try:
        return QUANTIZE[qtype](np.ascontiguousarray(w)).tobytes()
    except ValueError as e:  # a block scale that overflows fp16
        raise ValueError(f"model's tensor {name} cannot be stored as {qtype}: {e}") from None


def _nbytes(shape: tuple[int, ...], qtype: str) -> int:
    n = int(np.prod(shape))
    return 4 * n if qtype == "F32" else n // formats.BLOCK * formats.BLOCK_BYTES[qtype.lower()]


def _pad(n: int) -> int:
    return -n % ALIGNMENT


def _string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(vtype: GGUFValueType, value) -> bytes:
    if vtype == GGUFValueType.STRING:
        return _string(value)
    if vtype == GGUFValueType.ARRAY:
        item_type, items = value
        return struct.pack("<IQ", item_type, len(items)) + b"".join(_value(item_type, v) for v in items)
    return struct.pack(_PACK[vtype], value)


def _header(kv: list, plan: list, shapes: list, sizes: list) -> bytes:
    """Everything before the first tensor's data, padded to ALIGNMENT."""
    out = [b"GGUF", struct.pack("<IQQ", 3, len(plan), len(kv))]
    out += [_string(key) + struct.pack("<I", vtype) + _value(vtype, value) for key, vtype, value in kv]
    offset = 0
    for (gguf_name, _, q), shape, size in zip(plan, shapes, sizes):
        dims = shape[::-1]  # innermost first: a [out, in] matrix is stored as dims (in, out)
        out.append(_string(gguf_name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, GGML_TYPE[q], offset))
        offset += size + _pad(size)
    head = b"".join(out)
    return head + bytes(_pad(len(head)))
