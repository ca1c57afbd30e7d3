"""Lab 09, fine-tuning under the memory wall (notebook 09): where training's bytes go (the 16 bytes per
parameter, activations) measured and computed, activation checkpointing, LoRA and QLoRA on TinyLM's table of
linear layers, blockwise 8-bit and paged optimizer states, ZeRO stage 1 on real gloo ranks, the fact-checks.

    memory         training_memory (the calculator), measure_step (the profiler), lm_loss
    checkpointing  checkpointed_loss, checkpoint_sweep, sqrt_rule
    lora           LoRALinear, FrozenBase (FP32 / BF16 / NF4 / INT4), add_lora, merge, unmerge
    train          the new task's batches, fine_tune, evaluate (held-out accuracy and forgetting)
    optim8bit      dynamic codebooks, quantize_blockwise, AdamW8bit     paged   StepOrder, replay_paged_states
    zero           ZeroOne (ZeRO-1 over any optimizer), workers for labkit.parallel.Pool, compare_zero
    factcheck      laptops, QLoRA's 65B on 48 GB                        explore the calculator widget
"""

from . import checkpointing, exercises, explore, factcheck, lora, memory, optim8bit, paged, train, zero

__all__ = ["checkpointing", "exercises", "explore", "factcheck", "lora", "memory", "optim8bit", "paged", "train",
           "zero"]
