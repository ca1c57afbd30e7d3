"""TinyLM's GGUF export, read back by llama.cpp's own reader (gguf-py's GGUFReader, the independent reference):
every tensor's name, type, shape and bytes (against labkit's block formats, and dequantized by gguf-py against
the model's weights), the metadata against the config, the Q/K row permutation against RoPE computed both
ways, a llama forward pass written here from the file against TinyLM's logits, the byte-level vocabulary, and
the refusals."""
import errno
import io
import math
import os
import stat
import tempfile

import numpy as np
import pytest
import torch
import torch.nn as nn

import gguf
from gguf.quants import dequantize as gguf_dequantize

from labkit.quant import formats
from labkit.quant.gguf import rope_permute, write_gguf
from labkit.tinylm import ByteTokenizer, TinyLM, TinyLMConfig, load_pretrained
from labkit.tinylm.model import apply_rope, rope_tables

from ..refusals import assert_refused

QTYPES = ("F32", "Q8_0", "Q4_0")
T = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def model():
    return load_pretrained()[0]


@pytest.fixture(scope="module")
def untied():
    torch.manual_seed(0)
    return TinyLM(TinyLMConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=1, d_ff=96, max_seq_len=64,
                               rope_theta=500.0, norm_eps=1e-6, tie_embeddings=False)).eval()


@pytest.fixture(scope="module")
def files(model, untied, tmp_path_factory):
    """{(which, qtype): GGUFReader} for the pretrained (tied) model and a small untied one."""
    folder = tmp_path_factory.mktemp("gguf")
    return {(which, q): gguf.GGUFReader(write_gguf(m, folder / f"{which}-{q}.gguf", q))
            for which, m in (("tied", model), ("untied", untied)) for q in QTYPES}


def expected_tensors(cfg: TinyLMConfig, qtype: str) -> dict[str, tuple[str, str]]:
    """GGUF name -> (TinyLM parameter, ggml type name), by llama.cpp's rules: norms F32; Q8_0 everywhere else;
    for Q4_0 the output matrix (token_embd when tied) in Q8_0 (llama-quantize: Q6_K, Q8_0 for rows of 128)."""
    out_type = "F32" if qtype == "F32" else "Q8_0"
    names = {"token_embd.weight": ("tok_emb.weight", out_type if cfg.tie_embeddings else qtype),
             "output_norm.weight": ("norm.weight", "F32")}
    if not cfg.tie_embeddings:
        names["output.weight"] = ("lm_head.weight", out_type)
    for i in range(cfg.n_layers):
        for g, t in (("attn_norm", "attn_norm"), ("ffn_norm", "mlp_norm")):
            names[f"blk.{i}.{g}.weight"] = (f"layers.{i}.{t}.weight", "F32")
        for g, t in (("attn_q", "attn.wq"), ("attn_k", "attn.wk"), ("attn_v", "attn.wv"), ("attn_output", "attn.wo"),
                     ("ffn_gate", "mlp.w_gate"), ("ffn_up", "mlp.w_up"), ("ffn_down", "mlp.w_down")):
            names[f"blk.{i}.{g}.weight"] = (f"layers.{i}.{t}.weight", qtype)
    return names


def stored_weight(model, gguf_name: str, param: str) -> np.ndarray:
    """The float32 matrix the file should hold: the parameter, Q/K rows permuted for llama.cpp's RoPE."""
    w = model.state_dict()[param].numpy()
    if "attn_q" in gguf_name:
        return rope_permute(w, model.cfg.n_heads)
    return rope_permute(w, model.cfg.n_kv_heads) if "attn_k" in gguf_name else w


@pytest.mark.parametrize("which", ["tied", "untied"])
@pytest.mark.parametrize("qtype", QTYPES)
def test_every_tensor_is_labkits_own_quantization_byte_for_byte(files, model, untied, which, qtype):
    m = model if which == "tied" else untied
    reader, expected = files[which, qtype], expected_tensors(m.cfg, qtype)
    assert sorted(t.name for t in reader.tensors) == sorted(expected)
    for t in reader.tensors:
        param, type_name = expected[t.name]
        w = stored_weight(m, t.name, param)
        assert t.tensor_type == T[type_name], t.name
        assert t.shape.tolist() == list(w.shape[::-1]), t.name  # ggml dims: innermost (a row) first
        if type_name == "F32":
            assert t.data.dtype == np.float32 and np.array_equal(t.data.reshape(w.shape), w), t.name
        else:
            blocks = {"Q8_0": formats.quantize_q8_0, "Q4_0": formats.quantize_q4_0}[type_name](w)
            assert t.data.tobytes() == blocks.tobytes(), t.name
        assert t.data_offset % 32 == 0


@pytest.mark.parametrize("qtype", QTYPES)
def test_gguf_dequantizes_to_the_weights_within_the_formats_error(files, model, qtype):
    # per block of 32: Q8_0 rounds to half a step (amax / 254), Q4_0 may clip the side opposite its largest
    # value by a whole step (amax / 8); the fp16 scale adds up to 2^-11 relative on at most 127 or 8 steps
    bound = {"F32": 0.0, "Q8_0": 1 / 254 + 2 ** -10, "Q4_0": 1 / 8 + 2 ** -8}
    for t in files["tied", qtype].tensors:
        param, type_name = expected_tensors(model.cfg, qtype)[t.name]
        w = stored_weight(model, t.name, param)
        got = gguf_dequantize(t.data, t.tensor_type).reshape(w.shape)
        err, amax = np.abs(got - w).reshape(-1, 32), np.abs(w).reshape(-1, 32).max(axis=1, keepdims=True)
        assert (err <= bound[type_name] * amax).all(), t.name
        if type_name != "F32":
            assert 0 < err.mean() < bound[type_name] * amax.mean() / 2, t.name  # really quantized, mostly finer


@pytest.mark.parametrize("which", ["tied", "untied"])
def test_metadata_is_the_models_config(files, model, untied, which):
    cfg = (model if which == "tied" else untied).cfg
    for qtype, file_type in (("F32", 0), ("Q8_0", 7), ("Q4_0", 2)):  # llama_ftype ALL_F32, MOSTLY_Q8_0, MOSTLY_Q4_0
        fields = files[which, qtype].fields
        value = {k: f.contents() for k, f in fields.items()}
        assert value["general.architecture"] == "llama" and value["general.file_type"] == file_type
        assert value["GGUF.version"] == 3
        assert value["general.quantization_version"] == 2  # ggml's GGML_QNT_VERSION: llama.cpp reads Q4_0/Q8_0 by it
        assert fields["general.quantization_version"].types == [gguf.GGUFValueType.UINT32]
        assert (value["llama.context_length"], value["llama.embedding_length"], value["llama.block_count"],
                value["llama.feed_forward_length"], value["llama.attention.head_count"],
                value["llama.attention.head_count_kv"], value["llama.rope.dimension_count"],
                value["llama.vocab_size"]) == (cfg.max_seq_len, cfg.d_model, cfg.n_layers, cfg.d_ff, cfg.n_heads,
                                               cfg.n_kv_heads, cfg.head_dim, cfg.vocab_size)
        assert value["llama.rope.freq_base"] == np.float32(cfg.rope_theta)
        assert value["llama.attention.layer_norm_rms_epsilon"] == np.float32(cfg.norm_eps)
        assert fields["llama.block_count"].types == [gguf.GGUFValueType.UINT32]
        assert fields["llama.rope.freq_base"].types == [gguf.GGUFValueType.FLOAT32]


def interleaved_rope(x: np.ndarray, theta: float) -> np.ndarray:
    """llama.cpp's RoPE for the llama architecture (LLAMA_ROPE_TYPE_NORM): x [T, heads, hd] at positions 0..T-1;
    the neighbours (2i, 2i + 1) turn by pos * theta^(-2i / hd). Written from ggml's rope, not from labkit."""
    n, _, hd = x.shape
    angle = np.arange(n)[:, None, None] * theta ** (-np.arange(0, hd, 2) / hd)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * np.cos(angle) - odd * np.sin(angle)
    out[..., 1::2] = even * np.sin(angle) + odd * np.cos(angle)
    return out


def f32_matrix(reader, name: str) -> np.ndarray:
    t = next(t for t in reader.tensors if t.name == name)
    return np.asarray(gguf_dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(t.shape.tolist()[::-1])


def test_the_permuted_rows_under_interleaved_rope_give_tinylms_rotation(files, model):
    cfg, attn = model.cfg, model.layers[1].attn
    x = torch.randn(12, cfg.d_model, generator=torch.Generator().manual_seed(3))
    cos, sin = rope_tables(cfg.head_dim, 12, cfg.rope_theta)
    ours = {}
    for name, w, heads in (("q", attn.wq.weight.detach(), cfg.n_heads), ("k", attn.wk.weight.detach(), cfg.n_kv_heads)):
        y = (x @ w.T).view(12, heads, cfg.head_dim).transpose(0, 1)  # [heads, T, hd], TinyLM's layout
        ours[name] = apply_rope(y[None], cos, sin)[0].transpose(0, 1).double().numpy()  # [T, heads, hd]
    reader = files["tied", "F32"]
    theirs = {n: interleaved_rope((x.double().numpy() @ f32_matrix(reader, f"blk.1.attn_{n}.weight").T)
                                  .reshape(12, -1, cfg.head_dim), cfg.rope_theta) for n in "qk"}
    half = cfg.head_dim // 2
    order = np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)  # interleaved <- half-split
    for n in "qk":
        np.testing.assert_allclose(theirs[n], ours[n][..., order], atol=2e-5)
    group = cfg.n_heads // cfg.n_kv_heads
    scores = lambda q, k: np.einsum("thd,shd->hts", q, np.repeat(k, group, axis=1))  # noqa: E731
    np.testing.assert_allclose(scores(theirs["q"], theirs["k"]), scores(ours["q"], ours["k"]), atol=1e-4)


def llama_logits(reader, tokens: list[int]) -> np.ndarray:
    """Logits [T, vocab] of a llama-architecture GGUF, computed here in float64 as llama.cpp's llama graph
    does (RMSNorm, interleaved RoPE, grouped-query causal attention, SwiGLU), from the file alone."""
    meta = {k: f.contents() for k, f in reader.fields.items()}
    n_heads, n_kv = meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]
    eps, theta = meta["llama.attention.layer_norm_rms_epsilon"], meta["llama.rope.freq_base"]
    w = lambda name: f32_matrix(reader, name)  # noqa: E731
    norm = lambda v, g: v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * g  # noqa: E731
    x, n = w("token_embd.weight")[tokens], len(tokens)
    for i in range(meta["llama.block_count"]):
        b = f"blk.{i}."
        h = norm(x, w(b + "attn_norm.weight"))
        q = interleaved_rope((h @ w(b + "attn_q.weight").T).reshape(n, n_heads, -1), theta)
        k = interleaved_rope((h @ w(b + "attn_k.weight").T).reshape(n, n_kv, -1), theta)
        v = (h @ w(b + "attn_v.weight").T).reshape(n, n_kv, -1)
        k, v = np.repeat(k, n_heads // n_kv, axis=1), np.repeat(v, n_heads // n_kv, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / math.sqrt(q.shape[-1]) + np.triu(np.full((n, n), -np.inf), 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        out = np.einsum("hts,shd->thd", p / p.sum(-1, keepdims=True), v).reshape(n, -1)
        x = x + out @ w(b + "attn_output.weight").T
        h = norm(x, w(b + "ffn_norm.weight"))
        gate = h @ w(b + "ffn_gate.weight").T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ w(b + "ffn_up.weight").T)) @ w(b + "ffn_down.weight").T
    head = "output.weight" if any(t.name == "output.weight" for t in reader.tensors) else "token_embd.weight"
    return norm(x, w("output_norm.weight")) @ w(head).T


@pytest.mark.parametrize("which", ["tied", "untied"])
def test_a_llama_forward_pass_from_the_f32_file_gives_tinylms_logits(files, model, untied, which):
    m = model if which == "tied" else untied
    tokens = ByteTokenizer().encode("kv: tam=41 bok=07 ? bok=")
    with torch.no_grad():
        want = m(torch.tensor([tokens]))[0].double().numpy()
    np.testing.assert_allclose(llama_logits(files[which, "F32"], tokens), want, atol=2e-4, rtol=0)


def gpt2_byte_alphabet() -> dict[int, str]:
    """GPT-2's bytes_to_unicode as OpenAI's encoder.py builds it: the printable bytes keep their character,
    the rest take 256, 257, ... in byte order."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def test_the_vocabulary_maps_every_byte_to_tinylms_id(files):
    fields = files["tied", "Q8_0"].fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    alphabet = gpt2_byte_alphabet()
    assert tokens == [alphabet[b] for b in range(256)] and tokens[32] == "Ġ" and tokens[10] == "Ċ"
    assert fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert fields["tokenizer.ggml.pre"].contents() == "smollm"  # llama.cpp: a GPT-2-style split, clean_spaces off
    assert fields["tokenizer.ggml.token_type"].contents() == [1] * 256  # LLAMA_TOKEN_TYPE_NORMAL
    merges = fields["tokenizer.ggml.merges"]
    assert merges.contents() == [] and merges.types == [gguf.GGUFValueType.ARRAY]
    assert int(merges.parts[3][0]) == gguf.GGUFValueType.STRING  # the empty array's item type, as llama.cpp checks
    tok, text = ByteTokenizer(), bytes(range(256)) + "kv: tam=41 ? 37+48=85\nß€".encode()
    # llama.cpp's BPE with no merges: each byte becomes its alphabet character, looked up in the vocabulary
    index = {t: i for i, t in enumerate(tokens)}
    ids = [index[alphabet[b]] for b in text]
    assert ids == tok.encode(text)
    back = {c: b for b, c in alphabet.items()}
    assert bytes(back[tokens[i]] for i in ids) == tok.decode_bytes(ids) == text
    newline = tok.encode("\n")
    assert [fields[f"tokenizer.ggml.{k}_token_id"].contents() for k in ("bos", "eos")] == newline * 2
    assert [fields[f"tokenizer.ggml.add_{k}_token"].contents() for k in ("bos", "eos")] == [False, False]


def test_bad_inputs_are_refused(model, tmp_path):
    path = tmp_path / "m.gguf"
    assert_refused(lambda: write_gguf(model, path, "Q4_1"), ValueError, "qtype", "Q4_1",
                   "one of ('F32', 'Q8_0', 'Q4_0')")
    assert_refused(lambda: write_gguf(model, path, 8), TypeError, "qtype", 8, "one of")
    with pytest.raises(TypeError, match="^model must be a TinyLM .*, got Linear$"):
        write_gguf(nn.Linear(2, 2), path, "F32")
    odd = TinyLM(TinyLMConfig(d_model=64, n_heads=4, n_kv_heads=2, d_ff=100, n_layers=1))
    for q in ("Q8_0", "Q4_0"):
        assert_refused(lambda: write_gguf(odd, path, q), ValueError, "model", "d_model=64, d_ff=100",
                       "multiples of 32")
    assert write_gguf(odd, path, "F32") == path  # F32 has no blocks: any width
    assert_refused(lambda: write_gguf(TinyLM(TinyLMConfig(vocab_size=300, n_layers=1)), path, "F32"), ValueError,
                   "model", "vocab_size=300", "vocab_size 256")
    extended = TinyLM(TinyLMConfig(n_layers=1))
    extended.layers[0].attn.q_norm = nn.LayerNorm(32)  # a parameter a llama GGUF has no place for
    assert_refused(lambda: write_gguf(extended, path, "F32"), ValueError, "model", "layers.0.attn.q_norm.weight",
                   "a float TinyLM")
    missing = tmp_path / "no" / "such" / "m.gguf"
    assert_refused(lambda: write_gguf(model, missing, "F32"), FileNotFoundError, "path", str(missing),
                   "an existing folder")
    assert_refused(lambda: write_gguf(model, tmp_path, "F32"), ValueError, "path", str(tmp_path), "not a folder")
    assert_refused(lambda: write_gguf(model, 5, "F32"), TypeError, "path", 5, "a file path")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"] and not missing.parent.exists()


def test_a_failed_write_leaves_no_file_and_keeps_the_old_one(model, tmp_path):
    broken = TinyLM(model.cfg)
    broken.load_state_dict(model.state_dict())
    with torch.no_grad():
        broken.layers[-1].mlp.w_down.weight[3, 5] = float("nan")  # the last matrix written: fails mid-file
    last = f"layers.{model.cfg.n_layers - 1}.mlp.w_down.weight"
    for q in QTYPES:
        assert_refused(lambda: write_gguf(broken, tmp_path / "new.gguf", q), ValueError, "model",
                       f"NaN or inf in {last}", "finite weights")
    old = tmp_path / "old.gguf"
    old.write_bytes(b"the previous export")
    with pytest.raises(ValueError):
        write_gguf(broken, old, "Q4_0")
    assert old.read_bytes() == b"the previous export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.gguf"]  # no new.gguf, no temporary file


def test_the_file_follows_the_umask_and_a_name_at_the_limit_fits(model, tmp_path):
    """open() would give 0o666 & ~umask; a name of 255 characters (the usual limit) still writes (the temporary
    name does not grow with it)."""
    old = os.umask(0o022)
    try:
        for mask, mode in ((0o022, 0o644), (0o002, 0o664), (0o077, 0o600)):
            os.umask(mask)
            path = write_gguf(model, tmp_path / f"m{mask:o}.gguf", "F32")
            assert stat.S_IMODE(path.stat().st_mode) == mode
    finally:
        os.umask(old)
    long = tmp_path / ("m" * 250 + ".gguf")
    assert write_gguf(model, long, "F32") == long and long.stat().st_size > 0


def test_an_os_error_names_the_path_given_not_the_temporary_file(model, tmp_path, monkeypatch):
    path = tmp_path / "m.gguf"

    def refused(*args, **kw):
        raise PermissionError(13, "Permission denied", str(tmp_path / ".gguf-abc123.tmp"))

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    assert_refused(lambda: write_gguf(model, path, "F32"), PermissionError, "path", str(path),
                   "a file in a folder this process can write (Permission denied)")
    monkeypatch.undo()

    def full(fd, *args, **kw):  # a disk that fills up mid-file
        class Full(io.BufferedWriter):
            def write(self, data):
                raise OSError(errno.ENOSPC, "No space left on device")
        return Full(io.FileIO(fd, "wb"))

    monkeypatch.setattr(os, "fdopen", full)
    assert_refused(lambda: write_gguf(model, path, "F32"), OSError, "path", str(path), "No space left on device")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []  # no file, no temporary file
