"""The per-GPU tile tables of the quantized matmul kernels (w4a16_tiles.py, w8a16_tiles.py), and
the environment's limit on the rows a layer sends those kernels."""
from __future__ import annotations

import json
import os

from nextok.errors import NextokError

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "configs")


def load_table(kind: str, device_name: str) -> dict:
    """NEXTOK_<KIND>_CONFIGS's table, else configs/<kind>_<gpu>.json ("NVIDIA H100 80GB HBM3" ->
    w4a16_h100_80gb_hbm3.json); {} where there is none."""
    path = os.environ.get(f"NEXTOK_{kind.upper()}_CONFIGS") or os.path.join(
        CONFIG_DIR, f"{kind}_" + device_name.replace("NVIDIA ", "").replace(" ", "_").lower() + ".json")
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def rows_limit(kind: str, default: int, lo: int, hi: int) -> int:
    """NEXTOK_<KIND>_ROWS, a whole number from lo to hi, else default."""
    name = f"NEXTOK_{kind.upper()}_ROWS"
    value = os.environ.get(name, "")
    if not value:
        return default
    if not value.isdigit() or not lo <= int(value) <= hi:
        raise NextokError(f"{name} must be a whole number from {lo} to {hi}, not {value!r}")
    return int(value)
