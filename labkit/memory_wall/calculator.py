"""The footprint and decode-ceiling calculator of notebook 01_memory_wall: sliders, or a static table.

    calculator()               # ipywidgets sliders for model, precision, batch, context and device
    calculator(static=True)    # the same report for the settings given, as text (no widgets needed)
"""

from __future__ import annotations

import inspect

from . import footprint as fp
from .. import specs
from .._checks import check_bool, fail


def report(model: str = "llama-2-70b", precision: str = "bf16", batch: int = 1, context: int = 4096,
           device: str = "h100-sxm") -> str:
    """Memory and speed of serving `model` at `precision` for `batch` sequences of `context` tokens on
    `device`, as a few lines of text (GB = 1e9 bytes). "fits on N" counts weights and KV cache
    (footprint.devices_needed). The decode ceiling is the lower of the memory ceiling and the compute roof
    (the device's BF16 peak, or FP32 where it has none)."""
    spec, dev = specs.model(model), specs.device(device)
    if dev.kind == "link":
        fail("device", device, f"a memory device, not a link: one of {tuple(_memory_devices())}")
    f = fp.footprint(spec, precision, batch, context)
    n_devices = fp.devices_needed(spec, precision, batch, context, dev.memory_bytes)
    peak = dev.peak_flops.get("bf16", dev.peak_flops.get("fp32"))
    tokens = fp.decode_tokens_per_s(spec, precision, batch, context, dev.bandwidth, peak_flops=peak)
    lines = [f"{model} at {precision}: {spec.n_params / 1e9:,.1f} B parameters "
             f"({spec.active_params / 1e9:,.1f} B active per token)"]
    if context > spec.context:
        lines.append(f"  note: {model} was trained for {spec.context:,} tokens of context, not {context:,}")
    for key in ("weights", "kv_cache", "activations", "total"):
        lines.append(f"  {key:<12}{f[key] / 1e9:>12,.1f} GB")
    lines.append(f"  fits on {n_devices} x {device} ({dev.memory_bytes / 1e9:,.0f} GB each)")
    lines.append(f"  decode ceiling at {dev.bandwidth / 1e12:.2f} TB/s: {tokens / batch:,.1f} tokens/s per "
                 f"sequence, {tokens:,.0f} tokens/s for the batch of {batch}"
                 + (" (if one device held it all)" if n_devices > 1 else ""))
    return "\n".join(lines)


def _memory_devices() -> list[str]:
    return specs.device_names("gpu") + specs.device_names("soc")


def calculator(static: bool = False, **settings):
    """Sliders (an ipywidgets.interactive) when ipywidgets is installed and `static` is False; otherwise print
    report(**settings) and return None. `settings` are report()'s arguments (the sliders' start values);
    unknown names are a TypeError, bad values are refused as report() refuses them, before any widget."""
    check_bool("static", static)
    known = list(inspect.signature(report).parameters)
    unknown = sorted(set(settings) - set(known))
    if unknown:
        fail("settings", settings, f"keyword arguments among {known} (unknown: {unknown})", TypeError)
    defaults = {name: p.default for name, p in inspect.signature(report).parameters.items()} | settings
    text = report(**defaults)  # refuses bad settings before anything is shown
    widgets = None
    if not static:
        try:
            import ipywidgets as widgets
        except ImportError:
            pass
    if widgets is None:
        print(text)
        return None
    w = widgets
    memory_devices = _memory_devices()
    return w.interactive(
        lambda **kw: print(report(**kw)),
        model=w.Dropdown(options=specs.model_names(), value=defaults["model"]),
        precision=w.Dropdown(options=list(fp.PRECISIONS), value=defaults["precision"]),
        batch=w.IntSlider(value=defaults["batch"], min=1, max=256),
        context=w.IntSlider(value=defaults["context"], min=128, max=131072, step=128),
        device=w.Dropdown(options=memory_devices, value=defaults["device"]),
    )
