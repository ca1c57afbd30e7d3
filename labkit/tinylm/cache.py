"""The KV-cache contract TinyLM's attention calls, and the contiguous cache that implements it
(notebook 00 generates with it; notebook 05 adds a paged cache behind the same contract).

    for each forward over T new tokens (positions length .. length + T - 1):
        for each layer:  k_all, v_all = cache.update(layer, k_new, v_new)   # [B, n_kv_heads, length + T, head_dim]
        then once:       cache.advance(T)                                    # length += T

Attention never touches a cache's storage: whatever the cache keeps (one preallocated tensor, a pool of
blocks, quantized codes), `update` stores the new keys and values and returns every key and value the
new tokens attend to, in position order, in the dtype of k_new.

A BatchedCache (lab 06) packs many sequences into one forward: TinyLM then takes each token's position from
the cache and hands attention itself to the cache.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from .._checks import check_int, check_positive_int, check_type, fail
from .config import TinyLMConfig


@runtime_checkable
class Cache(Protocol):
    """What TinyLM.forward needs from a KV cache (any object with these members will do)."""

    @property
    def length(self) -> int:
        """Positions already cached (the next token's position)."""

    @property
    def max_len(self) -> int:
        """The most positions the cache can hold."""

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [B, n_kv_heads, T, head_dim] at positions length .. length + T - 1 of `layer`; return
        the keys and values of positions 0 .. length + T - 1, [B, n_kv_heads, length + T, head_dim]."""

    def advance(self, n_tokens: int) -> None:
        """Mark n_tokens more positions as cached, after every layer's update."""


@runtime_checkable
class BatchedCache(Protocol):
    """A cache that runs attention itself, for a forward that packs several sequences of different lengths into
    one row (the serving lab's paged batch, labkit.serving.batch; vLLM's attention backends play this part).

        tokens [1, N]: sequence a's new tokens, then b's, ...   positions(N) -> int64 [N], each token's position
        per layer:  out = cache.attend(layer, q, k, v)   q [1, n_heads, N, head_dim], k, v [1, n_kv_heads, N,
                    head_dim] (rotary positions applied) -> [1, n_heads, N, head_dim]: the cache stores k, v
                    and lets each token attend to its own sequence's positions <= its own
        then once:  cache.advance(N)
    """

    def positions(self, n_tokens: int) -> torch.Tensor:
        """int64 [n_tokens]: the position of each packed token within its own sequence."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store k, v; return attention of every packed query over its own sequence, [1, n_heads, N, head_dim]."""

    def advance(self, n_tokens: int) -> None:
        """The forward over n_tokens packed tokens is done."""


class KVCache:
    """Contiguous KV cache: keys and values for every layer, preallocated to `max_len` positions.

        k, v: [n_layers, batch, n_kv_heads, max_len, head_dim];  positions [0, length) are filled.

    Reserving max_len up front is simple and wastes memory for short sequences: notebook 05 replaces it
    with a paged cache.
    """

    def __init__(self, cfg: TinyLMConfig, batch_size: int = 1, max_len: int | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        if not isinstance(cfg, TinyLMConfig):
            raise TypeError(f"cfg must be a TinyLMConfig, got {type(cfg).__name__}")
        max_len = cfg.max_seq_len if max_len is None else max_len
        check_positive_int("batch_size", batch_size)
        check_int("max_len", max_len, 1, cfg.max_seq_len)
        check_type("dtype", dtype, torch.dtype, "a torch.dtype (torch.float32, torch.bfloat16, ...)")
        if not dtype.is_floating_point:  # int8 would truncate every key and value: notebook 05 quantizes them properly
            fail("dtype", dtype, "a floating-point torch.dtype (torch.float32, torch.bfloat16, ...)")
        check_type("device", device, (str, torch.device), "a torch.device or a str such as 'cpu'")
        shape = (cfg.n_layers, batch_size, cfg.n_kv_heads, max_len, cfg.head_dim)
        self.cfg = cfg
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """See Cache.update. Writes into the preallocated tensors, returns views of positions [0, length + T)."""
        for name, t in (("k", k), ("v", v)):
            check_type(name, t, torch.Tensor, "a float tensor [batch, n_kv_heads, T, head_dim]")
            if not t.is_floating_point():
                fail(name, f"a {t.dtype} tensor", "a float tensor [batch, n_kv_heads, T, head_dim]", TypeError)
        expected = (self.batch_size, self.k.shape[2], k.shape[2] if k.dim() == 4 else -1, self.k.shape[4])
        if k.shape != v.shape or tuple(k.shape) != expected:
            raise ValueError(f"k and v must be [batch {self.batch_size}, n_kv_heads {self.k.shape[2]}, T, head_dim "
                             f"{self.k.shape[4]}] (the cache's config), got {tuple(k.shape)} and {tuple(v.shape)}")
        check_int("layer", layer, 0, self.k.shape[0] - 1)
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"cached {self.length} + new {k.shape[2]} positions must be <= max_len {self.max_len}")
        self.k[layer, :, :, self.length:end] = k
        self.v[layer, :, :, self.length:end] = v
        return self.k[layer, :, :, :end].to(k.dtype), self.v[layer, :, :, :end].to(k.dtype)

    def advance(self, n_tokens: int) -> None:
        check_int("n_tokens", n_tokens, 1, self.max_len - self.length)
        self.length += n_tokens

    def rewind(self, length: int) -> None:
        """Forget every position from `length` on (they will be overwritten): re-run a decode from the same
        prompt without rebuilding the cache (labkit.memory_wall.hardware times repeats this way)."""
        self.length = check_int("length", length, 0, self.length)

    def nbytes(self) -> int:
        """Bytes reserved by the cache (keys + values)."""
        return self.k.numel() * self.k.element_size() * 2
