"""Targeted mutation testing: does the test suite notice when labkit is broken on purpose?

    .venv/bin/python benchmarks/mutants.py                  # every mutant (about 35 minutes on 2 cores)
    .venv/bin/python benchmarks/mutants.py --only tinylm    # mutants whose name or file contains "tinylm"
    .venv/bin/python benchmarks/mutants.py --list           # the mutants and the tests each one runs
    .venv/bin/python benchmarks/mutants.py --check          # only check that every snippet still exists
    .venv/bin/python benchmarks/mutants.py --baseline       # first check the unmutated tests pass

A mutant is (name, file, exact source snippet, replacement, test files): one deliberate bug of the kind a
test suite lets through unnoticed (a bound off by one, a skipped column, a dropped check). The script first
checks that every snippet occurs exactly once in its file (it stops with the list of those that do not: a
refactor moved the code, so the mutant must be rewritten, not skipped). It then copies the repository to a
temporary folder (never edits the working tree: other people may be working in it), and for each mutant writes
the mutated file into the copy, runs the mutant's test files there with pytest (-x: the first failure kills it), and
restores the file. A test that outlives --timeout seconds is stopped by pytest-timeout's thread method (the
signal method cannot interrupt a loop compiled by numba) and the whole run, as a last resort, by a kill
--timeout + 30 seconds after it started; either counts as "killed (timeout)": a hang is a failure CI sees.

Verdicts: killed (a test failed), killed (timeout), survived (every test passed: the suite misses this bug),
error (pytest found no test or could not run: fix the mutant). Score = killed / (killed + survived).
Exit status 0 when nothing survived and nothing erred, 1 otherwise. Deterministic: hypothesis runs with the
project's derandomized profile (tests/conftest.py); the mutants are fixed text.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "__pycache__", ".hypothesis", ".pytest_cache", "student",
                                     "submissions", ".ipynb_checkpoints", "*.pyc")


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str          # path from the repository root
    snippet: str       # exact text, found exactly once in the file
    replacement: str
    tests: tuple[str, ...]
    select: str = ""   # pytest -k expression ("" runs every test of the files)


M = Mutant
MUTANTS = [
    # ---- labs 00-03 and the course checker ------------------------------------------------------------------
    M("gptq skips column j+1", "labkit/quant/gptq.py",
      "w[:, j + 1:] -= err[:, None] * hinv[j, j + 1:][None, :]",
      "w[:, j + 2:] -= err[:, None] * hinv[j, j + 2:][None, :]",
      ("tests/quant/test_gptq.py",)),
    M("gptq grid from the original weights", "labkit/quant/gptq.py",
      'q = quantize(w[:, j:j + g], bits, scheme, "channel")',
      'q = quantize(weight.detach().float()[:, j:j + g], bits, scheme, "channel")', ("tests/quant/test_gptq.py",)),
    M("gptq half-strength error feedback", "labkit/quant/gptq.py",
      "err = (w[:, j] - (c - z) * s) / hinv[j, j]", "err = 0.5 * (w[:, j] - (c - z) * s) / hinv[j, j]",
      ("tests/quant/test_gptq.py",)),
    M("gptq 10x damping", "labkit/quant/gptq.py",
      "h += damp * h.diagonal().mean()", "h += 10 * damp * h.diagonal().mean()", ("tests/quant/test_gptq.py",)),
    M("footprint KV ignores batch", "labkit/memory_wall/footprint.py",
      '"kv_cache": float(batch * context * spec.kv_bytes_per_token(kv)),',
      '"kv_cache": float(context * spec.kv_bytes_per_token(kv)),', ("tests/memory_wall/test_footprint.py",)),
    M("decode bytes KV ignores batch", "labkit/memory_wall/footprint.py",
      "+ batch * context * spec.kv_bytes_per_token(kv)", "+ context * spec.kv_bytes_per_token(kv)",
      ("tests/memory_wall/test_footprint.py",)),
    M("symmetric rounding half-up", "labkit/quant/qtensor.py",
      "codes = torch.round(x / scale[..., None]).clamp_(qmin, qmax)",
      "codes = torch.floor(x / scale[..., None] + 0.5).clamp_(qmin, qmax)", ("tests/quant/test_qtensor.py",)),
    M("zero-point floor 2^-12", "labkit/quant/qtensor.py",
      "hi.abs()).double() / 2 ** 14", "hi.abs()).double() / 2 ** 12", ("tests/quant/test_qtensor.py",)),
    M("byte rounding for odd sizes", "labkit/quant/qtensor.py",
      "return math.ceil(numel * bits / 8) + groups * extra", "return numel * bits // 8 + groups * extra",
      ("tests/quant/test_qtensor.py",)),
    M("NF4 tie direction", "labkit/quant/nf4.py",
      'scaled, side="left")', 'scaled, side="right")', ("tests/quant/test_nf4.py",)),
    M("exercise checker tolerance 100x looser", "labkit/course/check.py",
      "RTOL, ATOL = 1e-6, 1e-9", "RTOL, ATOL = 1e-4, 1e-7", ("tests/course/test_check.py",)),
    M("copy bandwidth halved", "labkit/memory_wall/hardware.py",
      '"copy": (lambda: np.copyto(b, a), 2 * a.nbytes)', '"copy": (lambda: np.copyto(b, a), a.nbytes)',
      ("tests/memory_wall/test_hardware.py",)),
    M("FLOP counted as n^3", "labkit/memory_wall/hardware.py",
      "return 2 * n**3 / measure(", "return n**3 / measure(", ("tests/memory_wall/test_hardware.py",)),
    M("calculator counts devices from weights only", "labkit/memory_wall/footprint.py",
      'math.ceil((f["weights"] + f["kv_cache"]) / memory)', 'math.ceil(f["weights"] / memory)',
      ("tests/memory_wall/test_footprint.py", "tests/memory_wall/test_calculator.py")),
    M("prefetch fills the whole device", "labkit/unified_memory/loop.py",
      "rules, n_frames - 1, counts, prefetched)", "rules, n_frames, counts, prefetched)",
      ("tests/unified_memory/test_prefetch.py", "tests/unified_memory/test_engine.py")),
    M("sample greedy on -inf", "labkit/tinylm/generate.py",
      "    if temperature == 0:\n        return int(z.argmax())",
      "    if temperature == 0 or not torch.isfinite(z).all():\n        return int(z.argmax())",
      ("tests/tinylm/test_generate.py",), "sample or softmax"),
    # ---- labkit.tinylm ------------------------------------------------------------------------------------
    M("KVCache accepts int8", "labkit/tinylm/cache.py",
      "if not dtype.is_floating_point:", "if False:", ("tests/tinylm/test_cache.py",)),
    M("perplexity windows do not overlap", "labkit/tinylm/eval.py",
      "for i in range(0, t.numel() - 1, ctx)]", "for i in range(0, t.numel() - 1, ctx + 1)]",
      ("tests/tinylm/test_eval.py",)),
    M("rotary positions turn the wrong way", "labkit/tinylm/model.py",
      "rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)",
      "rotated = torch.cat([x[..., half:], -x[..., :half]], dim=-1)", ("tests/tinylm/test_model.py",)),
    M("GQA heads grouped round-robin", "labkit/tinylm/model.py",
      "k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)",
      "k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)", ("tests/tinylm/test_model.py",)),
    M("param_counts forgets the final norm", "labkit/tinylm/config.py",
      '"norm": (2 * cfg.n_layers + 1) * d,', '"norm": 2 * cfg.n_layers * d,', ("tests/tinylm/test_config.py",)),
    M("top_k lets one more token in", "labkit/tinylm/generate.py",
      "kth = torch.topk(z, top_k).values[-1]", "kth = torch.topk(z, min(top_k + 1, z.numel())).values[-1]",
      ("tests/tinylm/test_generate.py",), "sample or softmax or top_k"),
    M("rewind moves forward", "labkit/tinylm/cache.py",
      'self.length = check_int("length", length, 0, self.length)',
      'self.length = check_int("length", length, 0, self.max_len)', ("tests/tinylm/test_cache.py",)),
    M("task answer read one position late", "labkit/tinylm/eval.py",
      "got = pred[j, len(p) - 1:len(p) - 1 + len(a)].tolist()", "got = pred[j, len(p):len(p) + len(a)].tolist()",
      ("tests/tinylm/test_eval.py",), "teacher_forced or wrong_answers"),
    # ---- labkit.unified_memory ----------------------------------------------------------------------------
    M("LRU ties broken by the larger page", "labkit/unified_memory/policies.py",
      "return frames[frame, PAGE] > frames[other, PAGE]", "return frames[frame, PAGE] < frames[other, PAGE]",
      ("tests/unified_memory/test_policies.py",)),
    M("a hit does not set clock's reference bit", "labkit/unified_memory/policies.py",
      "    frames[frame, REFERENCED] = 1\n    if eviction == LRU:", "    if eviction == LRU:",
      ("tests/unified_memory/test_engine.py",)),
    M("a hit does not end a fault batch", "labkit/unified_memory/loop.py",
      "state[IN_BATCH] = 0                              # a hit ends the batch of faults", "pass",
      ("tests/unified_memory/test_engine.py",)),
    M("density node taken at exactly the threshold", "labkit/unified_memory/prefetch.py",
      "> threshold * (node_end - node_start):", ">= threshold * (node_end - node_start):",
      ("tests/unified_memory/test_prefetch.py",)),
    M("evicted pages not counted on the link", "labkit/unified_memory/loop.py",
      "busy = (1 + n_prefetched + evicted) * costs.page_size", "busy = (1 + n_prefetched) * costs.page_size",
      ("tests/unified_memory/test_engine.py",)),
    M("an ended request gives back half its memory", "labkit/unified_memory/memory_modes.py",
      "            if dev:\n                used[i] -= b", "            if dev:\n                used[i] -= b / 2",
      ("tests/unified_memory/test_memory_modes.py", "tests/unified_memory/test_tenants.py")),
    M("HYBRID floor is the whole partition", "labkit/unified_memory/memory_modes.py",
      "return used[i] + b <= floor[i] or", "return used[i] + b <= part[i] or",
      ("tests/unified_memory/test_memory_modes.py",)),
    M("tensors not aligned to 4 KiB", "labkit/unified_memory/layouts.py",
      "offset += -(-row * rows // 4096) * 4096", "offset += row * rows", ("tests/unified_memory/test_layouts.py",)),
    M("zero-duration requests accepted", "labkit/unified_memory/memory_modes.py",
      'check_positive_int(f"requests[{index}] duration", r[3], unit="steps")', "r[3]",
      ("tests/unified_memory/test_memory_modes.py",)),
    # ---- labs 04-08: labkit.kv_cache ---------------------------------------------------------------------
    M("blocks_needed rounds a full block up", "labkit/kv_cache/blocks.py",
      "return -(-n_tokens // block_size)", "return n_tokens // block_size + 1", ("tests/kv_cache/test_blocks.py",)),
    M("prefix hit includes the last token's block", "labkit/kv_cache/blocks.py",
      "for i in range((len(tokens) - 1) // bs):", "for i in range(len(tokens) // bs):",
      ("tests/kv_cache/test_blocks.py",)),
    M("admission forgets hits taken from the evictable pool", "labkit/kv_cache/blocks.py",
      "reclaimed = sum(1 for b in hits if self._ref[b] == 0)", "reclaimed = 0", ("tests/kv_cache/test_blocks.py",)),
    M("append writes into a shared last block", "labkit/kv_cache/blocks.py",
      "return n % self.block_size == 0 or self._ref[table[-1]] > 1", "return n % self.block_size == 0",
      ("tests/kv_cache/test_blocks.py",)),
    M("copy-on-write keeps the source's reference", "labkit/kv_cache/blocks.py",
      "            self._ref[src] -= 1\n", "", ("tests/kv_cache/test_blocks.py",)),
    M("fork does not count the shared blocks", "labkit/kv_cache/blocks.py",
      "        for b in table:\n            self._ref[b] += 1\n", "", ("tests/kv_cache/test_blocks.py",)),
    M("prefix end evicted after its start", "labkit/kv_cache/blocks.py",
      "for b in reversed(blocks):", "for b in blocks:",
      ("tests/kv_cache/test_blocks.py", "tests/kv_cache/test_prefix.py")),
    M("hash chain not chained", "labkit/kv_cache/prefix.py",
      "parent = hash_fn(parent, tokens[i * block_size:(i + 1) * block_size])",
      "parent = hash_fn(None, tokens[i * block_size:(i + 1) * block_size])",
      ("tests/kv_cache/test_prefix.py", "tests/kv_cache/test_exercises.py")),
    M("image touching a block's start counted in it", "labkit/kv_cache/prefix.py",
      "if o < end and o + n > start)", "if o < end and o + n >= start)", ("tests/kv_cache/test_prefix.py",)),
    M("utilization counts one token too few", "labkit/kv_cache/waste.py",
      "r.output * (r.output + 1) // 2 for r in trace)", "r.output * (r.output - 1) // 2 for r in trace)",
      ("tests/kv_cache/test_waste.py",)),
    M("pow2 reservation doubles exact powers", "labkit/kv_cache/waste.py",
      "1 << (request.total - 1).bit_length()", "1 << request.total.bit_length()", ("tests/kv_cache/test_waste.py",)),
    M("kv_bytes ignores batch", "labkit/kv_cache/size.py",
      "return spec.kv_bytes_per_token(bytes_per_element) * context * batch",
      "return spec.kv_bytes_per_token(bytes_per_element) * context", ("tests/kv_cache/test_size.py",)),
    M("swap is one-way", "labkit/kv_cache/swap.py",
      "return 2 * blocks * (", "return blocks * (", ("tests/kv_cache/test_swap.py",)),
    M("recompute counts one FLOP per MAC", "labkit/kv_cache/swap.py",
      "return 2 * spec.active_params * n_tokens", "return spec.active_params * n_tokens",
      ("tests/kv_cache/test_swap.py",)),
    M("quantized scale overhead 16 bits", "labkit/kv_cache/quantized.py",
      "return _bits(fmt) + 32 / per_group", "return _bits(fmt) + 16 / per_group",
      ("tests/kv_cache/test_quantized.py",)),
    M("KV channel groups: transpose not undone", "labkit/kv_cache/quantized.py",
      "out[..., :full, :] = back.reshape(*x.shape[:-2], D, full).transpose(-1, -2).to(x.dtype)",
      "out[..., :full, :] = back.reshape(*x.shape[:-2], full, D).to(x.dtype)", ("tests/kv_cache/test_quantized.py",)),
    M("KV channel scales span every token, not a group", "labkit/kv_cache/quantized.py",
      'back = quantize(cols, _bits(fmt), "asym", group).dequantize()',
      'back = quantize(cols, _bits(fmt), "asym", "channel").dequantize()', ("tests/kv_cache/test_quantized.py",)),
    # ---- labs 04-08: labkit.parallel ---------------------------------------------------------------------
    M("planner splits KV over tp past the KV heads", "labkit/parallel/planner.py",
      "kv_split = 1 if spec.is_mla else min(tp, spec.n_kv_heads)", "kv_split = 1 if spec.is_mla else tp",
      ("tests/parallel/test_planner.py",)),
    M("planner splits dense weights over ep too", "labkit/parallel/planner.py",
      "weights = (dense / tp + routed / (tp * ep)) * stage * wl.weight_bytes",
      "weights = (dense + routed) / (tp * ep) * stage * wl.weight_bytes", ("tests/parallel/test_planner.py",)),
    M("planner deals fractional sequences over ep", "labkit/parallel/planner.py",
      "seqs = math.ceil(wl.batch / ep)", "seqs = wl.batch / ep", ("tests/parallel/test_planner.py",)),
    M("planner's largest PP stage rounded down", "labkit/parallel/planner.py",
      "largest = math.ceil(spec.n_layers / pp)", "largest = spec.n_layers // pp", ("tests/parallel/test_planner.py",)),
    M("tp_fits does not split the weights", "labkit/parallel/planner.py",
      'need = spec.n_params * check_positive("weight_bytes", weight_bytes) / tp',
      'need = spec.n_params * check_positive("weight_bytes", weight_bytes)', ("tests/parallel/test_planner.py",)),
    M("planner refuses TP a multiple of the KV heads", "labkit/parallel/planner.py",
      "if not spec.is_mla and spec.n_kv_heads % tp and tp % spec.n_kv_heads:",
      "if not spec.is_mla and spec.n_kv_heads % tp:", ("tests/parallel/test_planner.py",)),
    M("ring all-gather steps n, not n-1", "labkit/parallel/linkmodel.py",
      'return 2 * (n - 1) if op == "all_reduce" else n - 1', 'return 2 * (n - 1) if op == "all_reduce" else n',
      ("tests/parallel/test_linkmodel.py",)),
    M("send forgets the latency", "labkit/parallel/linkmodel.py",
      'return self.alpha + check_positive("nbytes", nbytes', 'return check_positive("nbytes", nbytes',
      ("tests/parallel/test_linkmodel.py", "tests/parallel/test_pipeline.py"), "linkmodel or predicted"),
    M("all-reduce bytes without the factor 2", "labkit/parallel/collectives.py",
      'factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n',
      'factor = (n - 1) / n if op == "all_reduce" else (n - 1) / n',
      ("tests/parallel/test_collectives.py", "tests/parallel/test_linkmodel.py")),
    M("ring all-gather sends the wrong chunk", "labkit/parallel/collectives.py",
      "c = (r + shift - s) % n", "c = (r - s) % n", ("tests/parallel/test_collectives.py",)),
    M("bubble fraction denominator one short", "labkit/parallel/schedule.py",
      "return (p - 1) / (m + p - 1)", "return (p - 1) / (m + p)", ("tests/parallel/test_schedule.py",)),
    M("1F1B warms up one micro-batch too many", "labkit/parallel/schedule.py",
      "warm = min(p - s - 1, m)", "warm = min(p - s, m)", ("tests/parallel/test_schedule.py",)),
    M("split_layers gives the extra layer to one stage too many", "labkit/parallel/pipeline.py",
      "out.append((start, start + base + (s < extra)))", "out.append((start, start + base + (s <= extra)))",
      ("tests/parallel/test_pipeline.py",), "split_layers"),
    M("row-parallel layer forgets its all-reduce", "labkit/parallel/tensor.py",
      "return self.comm.all_reduce(self.linear(x))", "return self.linear(x)",
      ("tests/parallel/test_tensor.py",), "tp2_logits"),
    M("vocab-parallel embedding looks up rows past its slice", "labkit/parallel/tensor.py",
      "mine = (local >= 0) & (local < rows)", "mine = local >= 0",
      ("tests/parallel/test_tensor.py",), "tp2_logits_of_tokens"),
    M("logits gathered in the wrong order", "labkit/parallel/tensor.py",
      ".permute(1, 2, 0, 3).reshape(B, T, -1)", ".permute(1, 2, 3, 0).reshape(B, T, -1)",
      ("tests/parallel/test_tensor.py",), "tp2_logits"),
    # ---- labs 04-08: labkit.day0 ------------------------------------------------------------------------
    M("vision tower count misses its final norm", "labkit/day0/plan.py",
      '"vision_tower": vision_spec(cfg).n_params + v.hidden_size,', '"vision_tower": vision_spec(cfg).n_params,',
      ("tests/day0/test_plan.py",), "counts"),
    M("projector count forgets the second bias", "labkit/day0/plan.py",
      "+ t.d_model + t.d_model * t.d_model + t.d_model}", "+ t.d_model + t.d_model * t.d_model}",
      ("tests/day0/test_plan.py",), "counts"),
    M("QK-norm counted once per layer", "labkit/day0/plan.py",
      "qk = 2 * t.head_dim * t.n_layers if t.qk_norm else 0", "qk = t.head_dim * t.n_layers if t.qk_norm else 0",
      ("tests/day0/test_plan.py",), "counts"),
    M("rank params forget the replicated norms", "labkit/day0/plan.py",
      'return (spec.n_params - spec.counts()["norm"]) // tp + norms',
      'return (spec.n_params - spec.counts()["norm"]) // tp', ("tests/day0/test_plan.py",)),
    M("image budget rounds images down", "labkit/day0/plan.py",
      "images = min(math.ceil(budget / per_image), cfg.max_images_per_prompt * seqs)",
      "images = min(budget // per_image, cfg.max_images_per_prompt * seqs)",
      ("tests/day0/test_plan.py",), "image_budget"),
    M("footprint KV ignores max_num_seqs", "labkit/day0/plan.py",
      '"kv_cache": max_num_seqs * context * spec.kv_bytes_per_token(kv_element) // tp,',
      '"kv_cache": context * spec.kv_bytes_per_token(kv_element) // tp,', ("tests/day0/test_plan.py",)),
    M("footprint total counts one rank", "labkit/day0/plan.py",
      'out["total"] = tp * out["rank_total"] + out["encoder_total"]',
      'out["total"] = out["rank_total"] + out["encoder_total"]', ("tests/day0/test_plan.py",)),
    M("patches per image not squared", "labkit/day0/config.py",
      "return (self.image_size // self.patch_size) ** 2", "return self.image_size // self.patch_size",
      ("tests/day0/test_config.py", "tests/day0/test_model.py")),
    M("patch_dim forgets the channels", "labkit/day0/config.py",
      "return self.num_channels * self.patch_size ** 2", "return self.patch_size ** 2", ("tests/day0/test_model.py",)),
    M("rank slice one row short", "labkit/day0/loading.py",
      "(slice(rank * n, (rank + 1) * n),)", "(slice(rank * n, (rank + 1) * n - 1),)",
      ("tests/day0/test_loading.py",), "rank_slices"),
    M("shard closed when it would be exactly full", "labkit/day0/release.py",
      "if used + size > limit:", "if used + size >= limit:", ("tests/day0/test_release.py",), "split"),
    M("header accepts a tensor of the wrong byte size", "labkit/tinylm/header.py",
      "if begin < 0 or end - begin != nbytes:", "if begin < 0:",
      ("tests/day0/test_release.py", "tests/tinylm/test_header.py"), "broken"),
    M("image pixel limit not checked", "labkit/day0/multimodal.py",
      "if w * h > max_pixels:", "if False:", ("tests/day0/test_multimodal.py",), "url"),
    # ---- labs 04-08: the KV values' axis, pipeline sends, the vision tower's pixel range, the pixels' layout
    M("values quantized along the keys' axis", "labkit/kv_cache/quantized.py",
      "fake_quantize(v_all, self.fmt, self.value_axis, self.group))",
      "fake_quantize(v_all, self.fmt, self.key_axis, self.group))",
      ("tests/kv_cache/test_quantized.py",)),
    M("one pipeline send too many", "labkit/parallel/planner.py",
      '"pp send": (pp - 1) *', '"pp send": pp *', ("tests/parallel/test_planner.py",)),
    M("the vision tower sees [0, 1] pixels", "labkit/day0/model.py",
      "self.vision_tower(pixels * 2 - 1)", "self.vision_tower(pixels)", ("tests/day0/test_model.py",)),
    M("pixels transposed", "labkit/day0/images.py",
      ".permute(0, 3, 1, 2).float() / 255", ".permute(0, 3, 2, 1).float() / 255", ("tests/day0/test_images.py",)),
    # ---- labs 04-08: labkit.serving -------------------------------------------------------------
    M("top-p keeps the token after the one that reaches p", "labkit/serving/sampling.py",
      "last = (before < params.top_p).sum(-1, keepdim=True) - 1",
      "last = (before <= params.top_p).sum(-1, keepdim=True) - 1",
      ("tests/serving/test_sampling.py",)),
    M("top-k drops the k-th token's ties and the k-th", "labkit/serving/sampling.py",
      'z = z.masked_fill(z < kth, float("-inf"))', 'z = z.masked_fill(z <= kth, float("-inf"))',
      ("tests/serving/test_sampling.py",)),
    M("preemption victim from the front of the order", "labkit/serving/scheduler.py",
      "victim = queue.pop() if queue else seq", "victim = queue.pop(0) if queue else seq",
      ("tests/serving/test_scheduler.py",), "victim or latest"),
    M("chunked prefill ignores the token budget", "labkit/serving/scheduler.py",
      'n = min(todo[seq.request_id], budget) if self.policy == "chunked" else todo[seq.request_id]',
      "n = todo[seq.request_id]", ("tests/serving/test_scheduler.py",), "chunked or random_traces"),
    M("engine sizes its own pool whatever the runner's", "labkit/serving/engine.py",
      "self.config = config.resolve(self.cfg, pool=(runner.num_blocks, runner.block_size))",
      "self.config = config.resolve(self.cfg)", ("tests/serving/test_engine.py",), "runner"),
    M("a runner failure leaves its requests running", "labkit/serving/engine.py",
      "            self._fail_step(sched, step, e)\n            raise", "            raise",
      ("tests/serving/test_engine.py",), "fail"),
    M("max_tokens lets one more token out", "labkit/serving/engine.py",
      '"length" if seq.num_output_tokens >= seq.params.max_tokens else None',
      '"length" if seq.num_output_tokens > seq.params.max_tokens else None', ("tests/serving/test_engine.py",),
      "stop_tokens"),
    M("a prompt as long as the context is admitted", "labkit/serving/sequence.py",
      "if seq.num_prompt_tokens >= cfg.max_seq_len:", "if seq.num_prompt_tokens > cfg.max_seq_len:",
      ("tests/serving/test_engine.py",), "context"),
    M("logits of the first token of each row", "labkit/serving/batch.py",
      "ends = torch.tensor(self.query_lens).cumsum(0) - 1",
      "ends = torch.tensor(self.query_lens).cumsum(0) - torch.tensor(self.query_lens)",
      ("tests/serving/test_engine.py",), "alone"),
    M("a decode group of mixed lengths attends without its mask", "labkit/serving/batch.py",
      "mask = None if lens[-1] == lens[0] else", "mask = None if len(lens) > 0 else",
      ("tests/serving/test_batch.py",), "group_edges"),
    M("a decode group writes its outputs to rows in packed order, not its own", "labkit/serving/batch.py",
      "self.decode.append((torch.tensor([starts[i] for i in seqs]), slots, mask))",
      "self.decode.append((torch.tensor(sorted(starts[i] for i in seqs)), slots, mask))",
      ("tests/serving/test_batch.py",), "group_edges"),
    M("an engine process that dies is not noticed", "labkit/serving/service.py",
      '                self._set_state("failed", f"the engine process died (exit code {self._exitcode()})")\n'
      "        self._shutdown()",
      '                return\n        self._shutdown()',
      ("tests/serving/test_core.py",), "killed"),
    M("chunked budget default 32", "labkit/serving/config.py",
      'budget = max(64, self.max_num_seqs) if self.policy == "chunked"',
      'budget = max(32, self.max_num_seqs) if self.policy == "chunked"',
      ("tests/serving/test_config.py",)),
    M("stream_interval holds one token too many", "labkit/serving/service.py",
      "if len(held) >= self.stream_interval:", "if len(held) > self.stream_interval:",
      ("tests/serving/test_service.py",), "interval"),
    M("a chat refusal says prompt", "labkit/serving/api.py",
      'message = refused.message("messages" if kind == "chat" else "prompt")', "message = refused.message()",
      ("tests/serving/test_api.py",)),
    # ---- labs 04-08: labkit.cluster --------------------------------------------------------------
    M("router retries once more than its cap", "labkit/cluster/forward.py",
      "while len(tried) <= router.retries and not router.closing:",
      "while len(tried) <= router.retries + 1 and not router.closing:", ("tests/cluster/test_router.py",), "cap"),
    M("a stream closed early marks its replica down", "labkit/cluster/forward.py",
      'Failure("the replica closed the stream before [DONE]")',
      'Failure("the replica closed the stream before [DONE]", True)',
      ("tests/cluster/test_router.py",), "ends_early"),
    M("a 4xx answer is retried", "labkit/cluster/forward.py",
      "    if status >= 500:\n        return Failure(_said(status, answer))",
      "    if status >= 400:\n        return Failure(_said(status, answer))",
      ("tests/cluster/test_router.py",), "bad_input"),
    M("SSE events cut at single newlines", "labkit/cluster/forward.py",
      '*events, self._pending = self._pending.split(b"\\n\\n")', '*events, self._pending = self._pending.split(b"\\n")',
      ("tests/cluster/test_forward.py",)),
    M("a ticket resolved twice", "labkit/cluster/forward.py",
      "        if self.outcome is not None:\n            return False\n", "",
      ("tests/cluster/test_forward.py",)),
    M("rendezvous takes the lowest weight", "labkit/cluster/policies.py",
      "return max(ids, key=lambda id: (weight(id, key), id))", "return min(ids, key=lambda id: (weight(id, key), id))",
      ("tests/cluster/test_policies.py",)),
    M("least outstanding ties go to the most recent", "labkit/cluster/policies.py",
      "key=lambda ir: (ir[1].outstanding, self.last.get(ir[1].id, -1), ir[0]))[1]",
      "key=lambda ir: (ir[1].outstanding, -self.last.get(ir[1].id, -1), ir[0]))[1]",
      ("tests/cluster/test_policies.py",)),
    M("round robin skips one", "labkit/cluster/policies.py",
      "        self.count += 1\n        return replica", "        self.count += 2\n        return replica",
      ("tests/cluster/test_policies.py",)),
    M("a replica expires only a heartbeat late twice", "labkit/cluster/registry.py",
      "now - r.last_heartbeat > self.heartbeat_timeout]", "now - r.last_heartbeat > 2 * self.heartbeat_timeout]",
      ("tests/cluster/test_registry.py",)),
    M("peak bytes counts frees after allocations", "labkit/cluster/buffers.py",
      "+ [(b.last + 1, -_round_up(b.nbytes, alignment)) for b in buffers])",
      "+ [(b.last, -_round_up(b.nbytes, alignment)) for b in buffers])",
      ("tests/cluster/test_buffers.py",)),
    # ---- lab 03's C rungs on every CPU: the build cache, the layout's codes, the rungs' range ------------------
    M("C rungs: the build cache ignores what the flags target", "labkit/quant/kernels_c.py",
      "platform.machine(), target(cc, flags)))", "platform.machine()))", ("tests/quant/test_kernels_c.py",)),
    M("C rungs: lay_out takes a code of 8", "labkit/quant/kernels_c.py",
      "if codes.min() < -8 or codes.max() > 7:", "if codes.min() < -8 or codes.max() > 8:",
      ("tests/quant/test_kernels_c.py",)),
    M("C rungs: rungs 4 and 6 return inf or NaN", "labkit/quant/kernels.py",
      "    if not np.isfinite(y).all():\n        fail(\"x\"", "    if False:\n        fail(\"x\"",
      ("tests/quant/test_kernels.py",)),
    # ---- labs 01-04, 06-09: the 8-bit optimizer, LoRA, the training-memory formula, refusals and units ---------
    M("8-bit v map holds an exact 0", "labkit/finetune/optim8bit.py",
      "    levels = [-x for x in reversed(pos)] + [0.0] + pos if signed else pos\n",
      "    levels = [-x for x in reversed(pos)] + [0.0] + pos if signed else [0.0] + pos[1:]\n",
      ("tests/finetune/test_optim8bit.py",)),
    M("8-bit AdamW eps inside the square root", "labkit/finetune/optim8bit.py",
      'denom = (v / (1 - beta2 ** t)).sqrt_().add_(group["eps"])',
      'denom = (v / (1 - beta2 ** t)).add_(group["eps"]).sqrt_()',
      ("tests/finetune/test_optim8bit.py",)),
    M("8-bit AdamW eps before the bias correction", "labkit/finetune/optim8bit.py",
      'denom = (v / (1 - beta2 ** t)).sqrt_().add_(group["eps"])',
      'denom = v.sqrt().add_(group["eps"]) / (1 - beta2 ** t) ** 0.5',
      ("tests/finetune/test_optim8bit.py",)),
    M("8-bit AdamW ignores its closure", "labkit/finetune/optim8bit.py",
      "                loss = closure()", "                pass", ("tests/finetune/test_optim8bit.py",)),
    M("8-bit AdamW lets a NaN gradient into the states", "labkit/finetune/optim8bit.py",
      "        self._check_gradients()\n", "", ("tests/finetune/test_optim8bit.py",)),
    M("8-bit code table with equal levels accepted", "labkit/finetune/optim8bit.py",
      "    down = (code[1:] <= code[:-1]).nonzero()", "    down = (code[1:] < code[:-1]).nonzero()",
      ("tests/finetune/test_optim8bit.py",)),
    M("add_lora takes a layer type that matches nothing", "labkit/finetune/lora.py",
      "            if not found:\n", "            if False:\n", ("tests/finetune/test_lora.py",)),
    M("LoRA A bound 1 / in", "labkit/finetune/lora.py",
      "bound = 1 / math.sqrt(in_f)", "bound = 1 / in_f", ("tests/finetune/test_lora.py",)),
    M("LoRA A bound from the output width", "labkit/finetune/lora.py",
      "bound = 1 / math.sqrt(in_f)", "bound = 1 / math.sqrt(out_f)", ("tests/finetune/test_lora.py",)),
    M("every adapter from one seed", "labkit/finetune/lora.py",
      "LoRALinear(model.get_submodule(path), rank, alpha, base_dtype, seed=seed + i))",
      "LoRALinear(model.get_submodule(path), rank, alpha, base_dtype, seed=seed))", ("tests/finetune/test_lora.py",)),
    M("LoRALinear's forward takes any width", "labkit/finetune/lora.py",
      "        if x.dtype != self.A.dtype or x.dim() < 1 or x.shape[-1] != self.A.shape[1]:", "        if False:",
      ("tests/finetune/test_lora.py",)),
    M("FrozenBase leaves a NaN weight to the quantizer", "labkit/finetune/lora.py",
      '        if bad:\n            fail("weight", f"{bad} NaN or inf of {weight.numel()} values", "finite values")',
      "        if False:\n            pass", ("tests/finetune/test_lora.py",)),
    M("NF4 without double quantization in the calculator", "labkit/finetune/memory.py",
      "NF4_DQ_BITS = 4 + 8 / 64 + 32 / (64 * 256)", "NF4_DQ_BITS = 4 + 32 / 64", ("tests/finetune/test_memory.py",)),
    M("LoRA's weights forget the adapters' own copy", "labkit/finetune/memory.py",
      "weights = 2 * n + 2 * trained", "weights = 2 * n", ("tests/finetune/test_memory.py",)),
    M("checkpointed activations without the recomputed layer", "labkit/finetune/memory.py",
      "acts = s.n_layers * per_layer * CHECKPOINTED_BYTES_PER_D + per_layer * ACT_BYTES_PER_D",
      "acts = s.n_layers * per_layer * CHECKPOINTED_BYTES_PER_D", ("tests/finetune/test_memory.py",)),
    M("a LoRA rank up to the largest side", "labkit/finetune/memory.py",
      "return min(min(e.shape) for e in adapted_linears(", "return min(max(e.shape) for e in adapted_linears(",
      ("tests/finetune/test_memory.py",)),
    M("every k checkpoints blocks k - 1, 2k - 1", "labkit/tinylm/model.py",
      "if recompute and i % checkpoint_every == 0:", "if recompute and (i + 1) % checkpoint_every == 0:",
      ("tests/finetune/test_checkpointing.py", "tests/tinylm/test_block_loop.py")),
    M("sqrt rule rounds up", "labkit/finetune/checkpointing.py",
      "return max(1, round(math.sqrt(n_layers)))", "return max(1, math.ceil(math.sqrt(n_layers)))",
      ("tests/finetune/test_checkpointing.py",)),
    M("paged states take any bytes per value", "labkit/finetune/paged.py",
      '    check_positive("state_bytes_per_value", state_bytes_per_value, "bytes")\n', "",
      ("tests/finetune/test_paged.py",)),
    M("monitor windows unbounded", "labkit/unified_memory/links.py",
      "    if n_own > MAX_WINDOWS:", "    if False:", ("tests/unified_memory/test_links.py",), "window"),
    M("busy_B is link A's", "labkit/unified_memory/balancing.py",
      '"busy_B": r["link_busy"][1] if', '"busy_B": r["link_busy"][0] if', ("tests/unified_memory/test_balancing.py",)),
    M("a link's busy share not over the run's time", "labkit/unified_memory/links.py",
      '"link_busy": moved / nominal / t if t > 0', '"link_busy": moved / nominal if t > 0',
      ("tests/unified_memory/test_balancing.py",)),
    M("utilization without the other traffic", "labkit/unified_memory/links.py",
      "util = (own[:, :n_windows] + background) /", "util = own[:, :n_windows] /",
      ("tests/unified_memory/test_balancing.py",)),
    M("local claims' GB read as GiB", "labkit/memory_wall/local_claims.py",
      "GB, TB = 1e9, 1e12", "GB, TB = 2**30, 1e12", ("tests/memory_wall/test_local_claims.py",)),
    M("local latency compared in s against ms", "labkit/memory_wall/local_claims.py",
      'if 1e3 * r["per_token"] <= local_ms]',
      'if r["per_token"] <= local_ms]', ("tests/memory_wall/test_local_claims.py",)),
    M("edge limit taken in s", "labkit/memory_wall/local_claims.py",
      'limit = check_positive("limit_ms", limit_ms, unit="ms") / 1e3',
      'limit = check_positive("limit_ms", limit_ms, unit="ms")', ("tests/memory_wall/test_local_claims.py",)),
    M("every token when any token", "labkit/memory_wall/local_claims.py",
      "token_ok = {key: upto == max(prompts) for key, upto in token_upto.items()}",
      "token_ok = {key: upto > 0 for key, upto in token_upto.items()}",
      ("tests/memory_wall/test_local_claims.py",)),
    M("an edge verdict with no prompts", "labkit/memory_wall/local_claims.py",
      "isinstance(prompts, (list, tuple)) or not prompts:", "isinstance(prompts, (list, tuple)):",
      ("tests/memory_wall/test_local_claims.py",)),
    M("latency_fifth leaves fault_latency to fault_sweep_s", "labkit/memory_wall/local_claims.py",
      '    fault_latency = check_positive("fault_latency", fault_latency, unit="s")\n', "",
      ("tests/memory_wall/test_local_claims.py",)),
    M("check_order sorts names of any type", "labkit/cluster/reorder.py",
      '            check_type(f"order[{i}]", name, str, "a node name (str)")', "            pass",
      ("tests/cluster/test_reorder.py",), "not_a_node_name"),
    M("returned buffers die at the last node", "labkit/cluster/reorder.py",
      "end = len(order) if b in u.to_output else", "end = len(order) - 1 if b in u.to_output else",
      ("tests/cluster/test_reorder.py",), "not decode"),
    M("greedy picks the most bytes", "labkit/cluster/reorder.py",
      "pick = min(ready, key=lambda name: (net(name), position[name]))",
      "pick = max(ready, key=lambda name: (net(name), -position[name]))",
      ("tests/cluster/test_reorder.py",), "not decode"),
    M("greedy never counts a freed buffer", "labkit/cluster/reorder.py",
      "if readers[b] == 1 and b not in u.to_output)", "if readers[b] == 0 and b not in u.to_output)",
      ("tests/cluster/test_reorder.py",), "not decode"),
    M("lower bound forgets returned buffers", "labkit/cluster/reorder.py",
      "(b in u.to_output or readers[b] & descendants[x])", "readers[b] & descendants[x]",
      ("tests/cluster/test_reorder.py",), "not decode"),
    M("hierarchical all-reduce views a non-contiguous tensor", "labkit/parallel/hierarchical.py",
      "    if not t.is_contiguous():", "    if False:", ("tests/parallel/test_hierarchical.py",), "refuses"),
    M("GGUF quantization version 1", "labkit/quant/gguf.py",
      '("general.quantization_version", V.UINT32, 2)', '("general.quantization_version", V.UINT32, 1)',
      ("tests/quant/test_gguf.py",), "metadata"),
    M("GGUF file keeps mkstemp's 0600", "labkit/quant/gguf.py",
      "            os.chmod(tmp, 0o666 & ~_umask())", "            pass", ("tests/quant/test_gguf.py",), "umask"),
    M("GGUF temporary name grows with the path's", "labkit/quant/gguf.py",
      'prefix=".gguf-", suffix=".tmp")',
      'prefix=f".{path.name}.", suffix=".tmp")', ("tests/quant/test_gguf.py",), "umask"),
    M("GGUF OS errors name the temporary file", "labkit/quant/gguf.py",
      '        fail("path", str(path), f"a file in a folder this process can write ({e.strerror})", type(e))',
      "        raise", ("tests/quant/test_gguf.py",), "os_error"),
    M("2:4 pair with equal indices accepted", "labkit/quant/sparse.py",
      "not bool((pairs[:, 0] < pairs[:, 1]).all())", "not bool((pairs[:, 0] <= pairs[:, 1]).all())",
      ("tests/quant/test_sparse.py",), "refused"),
    M("an empty x quantized to nothing", "labkit/quant/formats.py",
      "    if x.ndim < 1 or x.size == 0 or x.shape[-1] % block:", "    if x.ndim < 1 or x.shape[-1] % block:",
      ("tests/quant/test_nf4.py",)),
    M("shortest_job by max_tokens", "labkit/serving/scheduler.py",
      "return seq.params.max_tokens - seq.num_output_tokens", "return seq.params.max_tokens",
      ("tests/serving/test_scheduler_order.py",), "still_has"),
    M("a rank model ignores the release's rope_theta", "labkit/day0/loading.py",
      "cfg.head_dim, cfg.max_seq_len, cfg.rope_theta))", "cfg.head_dim, cfg.max_seq_len, 10000.0))",
      ("tests/day0/test_loading.py",), "rope_theta"),
]


def check_snippets(mutants: list[Mutant], root: Path = ROOT) -> list[str]:
    """One line per mutant whose snippet is not found exactly once in its file (empty: all good)."""
    problems = []
    for m in mutants:
        path = root / m.file
        if not path.is_file():
            problems.append(f"{m.name}: {m.file} does not exist")
            continue
        n = path.read_text().count(m.snippet)
        if n != 1:
            problems.append(f"{m.name}: the snippet occurs {n} times in {m.file}: {m.snippet!r}")
        for test in m.tests:
            if not (root / test).is_file():
                problems.append(f"{m.name}: test file {test} does not exist")
    return problems


def run_tests(copy: Path, m: Mutant, timeout: float) -> tuple[str, float, str]:
    """(verdict, seconds, last lines of pytest's output) for the mutant's tests in `copy`."""
    env = {**os.environ, "PYTHONPATH": str(copy), "NUMBA_CACHE_DIR": str(copy / ".numba-cache"),
           "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = ([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header",
            f"--timeout={max(1, int(timeout))}", "--timeout-method=thread", *m.tests]
           + (["-k", m.select] if m.select else []))
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=copy, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout + 30)  # pytest-timeout ends a hung test first, normally
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return "killed (timeout)", time.monotonic() - start, out[-600:]
    seconds = time.monotonic() - start
    tail = "\n".join(out.strip().splitlines()[-6:])
    if proc.returncode == 0:
        return "survived", seconds, tail
    if proc.returncode == 1:
        return ("killed (timeout)" if "Timeout (>" in out else "killed"), seconds, tail
    if proc.returncode == 2 and "error" in tail.lower():  # the mutant broke an import: a collection error
        return "killed", seconds, tail
    return f"error (pytest exit {proc.returncode})", seconds, tail


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the mutants whose name or file contains this text")
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests, run nothing")
    parser.add_argument("--check", action="store_true", help="only check that every snippet exists once")
    parser.add_argument("--timeout", type=float, default=180, help="seconds per mutant (default 180)")
    parser.add_argument("--verbose", action="store_true", help="print pytest's last lines for every mutant")
    parser.add_argument("--baseline", action="store_true",
                        help="first run each mutant's tests on the unmutated copy: they must pass")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error(f"--timeout must be positive, got {args.timeout}")
    chosen = [m for m in MUTANTS if args.only in m.name or args.only in m.file]
    if not chosen:
        parser.error(f"no mutant matches --only {args.only!r}")
    if args.list:
        for m in chosen:
            print(f"{m.name:<48} {m.file:<38} {' '.join(m.tests)}" + (f" -k {m.select!r}" if m.select else ""))
        return 0
    problems = check_snippets(chosen)
    if problems:
        print("these mutants' snippets are not in their files exactly once (rewrite them):\n  " + "\n  ".join(problems))
        return 2
    print(f"{len(chosen)} mutants: every snippet found once")
    if args.check:
        return 0
    with tempfile.TemporaryDirectory(prefix="labkit-mutants-") as tmp:
        copy = Path(tmp) / "repo"
        shutil.copytree(ROOT, copy, ignore=COPY_IGNORE)
        where = subprocess.run([sys.executable, "-c", "import labkit; print(labkit.__file__)"], cwd=copy,
                               env={**os.environ, "PYTHONPATH": str(copy)}, capture_output=True, text=True)
        if not where.stdout.strip().startswith(str(copy)):
            print(f"the copy in {copy} does not import its own labkit ({where.stdout.strip() or where.stderr})")
            return 2
        if args.baseline:
            runs = {(m.tests, m.select): m for m in chosen}  # each distinct selection once
            failing = []
            for m in runs.values():
                verdict, seconds, tail = run_tests(copy, m, args.timeout)
                print(f"baseline {'ok' if verdict == 'survived' else verdict:<17} {seconds:6.1f} s  "
                      f"{' '.join(m.tests)}" + (f" -k {m.select!r}" if m.select else ""), flush=True)
                if verdict != "survived":
                    failing.append(tail)
            if failing:
                print("the unmutated tests do not pass: a kill would mean nothing\n" + "\n".join(failing))
                return 2
        results = []
        for i, m in enumerate(chosen, 1):
            path = copy / m.file
            original = path.read_text()
            path.write_text(original.replace(m.snippet, m.replacement))
            try:
                verdict, seconds, tail = run_tests(copy, m, args.timeout)
            finally:
                path.write_text(original)
            results.append((m, verdict))
            print(f"[{i:2d}/{len(chosen)}] {verdict:<17} {seconds:6.1f} s  {m.name}", flush=True)
            if args.verbose or verdict == "survived" or verdict.startswith("error"):
                print("      " + tail.replace("\n", "\n      "))
    killed = sum(v.startswith("killed") for _, v in results)
    survived = [m.name for m, v in results if v == "survived"]
    errors = [m.name for m, v in results if v.startswith("error")]
    timeouts = sum(v == "killed (timeout)" for _, v in results)
    scored = killed + len(survived)
    print(f"\nmutation score {killed}/{scored} = {killed / scored:.0%} killed" if scored else "\nno mutant scored",
          f"({timeouts} of them by timeout); survived: {survived or 'none'}; errors: {errors or 'none'}")
    return 0 if not survived and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
