"""Presets: real models described by their architecture, devices and links by their spec sheets
(notebooks 01 and 02; every later lab sizes real systems with them). Bottom layer."""

from .devices import DeviceSpec, device, device_names
from .models import ModelSpec, kv_bytes_per_token, model, model_names

__all__ = ["DeviceSpec", "device", "device_names", "ModelSpec", "kv_bytes_per_token", "model", "model_names"]
