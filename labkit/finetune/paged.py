"""Paged optimizer states (notebook 09, section 4): QLoRA's paged optimizers keep Adam's states in NVIDIA unified
memory, so that when the GPU runs short they are paged out to host memory and back on demand. Here the states
live in lab 02's pool (labkit.unified_memory.UnifiedMemory) and the real access order of a training step is
replayed through it:

    one step:   forward + backward touch the activations (an allocation of `activation_bytes`)
                optimizer step touches, parameter by parameter in the order the optimizer visited them,
                that parameter's m then its v

With a device smaller than activations + states, every step's activations push states out and the optimizer's
pass faults them back in: the fault and migration counts per step are what a paged optimizer pays. StepOrder
watches a real optimizer (any torch.optim.Optimizer, through its step hook) for the order to replay.
"""

from __future__ import annotations

import torch

from .._checks import check_positive, check_positive_int, check_type, fail
from ..unified_memory import UnifiedMemory


class StepOrder:
    """Watches `optimizer`'s steps (a post-step hook; the optimizer is unchanged): `order` holds the indices,
    counted over its param_groups in turn, of the parameters the last step updated, those with a gradient, in
    the order torch's optimizers and AdamW8bit visit them. `remove()` takes the hook off."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        check_type("optimizer", optimizer, torch.optim.Optimizer)
        self.order: list[int] = []
        self._hook = optimizer.register_step_post_hook(self._record)

    def _record(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self.order = [i for i, p in enumerate(params) if p.grad is not None]

    def remove(self) -> None:
        self._hook.remove()


def replay_paged_states(param_numels: list[int], order: list[int], activation_bytes: int, device_bytes: int,
                        steps: int = 3, state_bytes_per_value: float = 4.0, page_size: int = 4096) -> list[dict]:
    """Replay `steps` training steps through a UnifiedMemory of `device_bytes` (host: everything). Each parameter
    i gets two allocations (m and v) of param_numels[i] * state_bytes_per_value bytes; a step touches the
    activation allocation, then m and v of each parameter in `order` (the indices the optimizer visited).
    Returns per step: faults, migrations, evictions, bytes moved (host -> device and back), simulated seconds."""
    if not isinstance(param_numels, (list, tuple)) or not param_numels:
        fail("param_numels", param_numels, "a non-empty list of parameter sizes (elements)")
    for n in param_numels:
        check_positive_int("param_numels[i]", n)
    if not isinstance(order, (list, tuple)) or any(not isinstance(i, int) or not 0 <= i < len(param_numels)
                                                   for i in order):
        fail("order", order, f"a list of parameter indices in [0, {len(param_numels)})")
    check_positive_int("activation_bytes", activation_bytes)
    check_positive_int("steps", steps)
    check_positive("state_bytes_per_value", state_bytes_per_value, "bytes")
    state_bytes = [max(1, int(n * state_bytes_per_value)) for n in param_numels]
    total = activation_bytes + 2 * sum(state_bytes)
    um = UnifiedMemory(device_bytes=device_bytes, host_bytes=2 * total + 2**22, page_size=page_size)
    acts = um.alloc(activation_bytes, "activations")
    states = [(um.alloc(b, f"m{i}"), um.alloc(b, f"v{i}")) for i, b in enumerate(state_bytes)]
    rows = []
    for step in range(steps):
        before = um.stats.as_dict()
        um.access(acts)
        for i in order:
            um.access(states[i][0])
            um.access(states[i][1])
        after = um.stats.as_dict()
        rows.append({"step": step + 1, **{k: after[k] - before[k] for k in
                                          ("faults", "migrations", "evictions", "bytes_moved", "time_s")}})
    return rows
