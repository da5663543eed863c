"""The GEMM shapes a model sends: its linear layers' (N, K) from a Hugging Face style config, and the
token counts (M) a serving system sends, on a grid with a held-out half.

Used by ``python3 -m tilekiln.tune BUNDLE --model CONFIG.json`` (tune every layer of a model on
the tuning half of the grid) and by bench/sweep.py (time tilekiln's selection against torch on
both halves, reporting the held-out half apart: the number that counts is the one on shapes no
table saw). Standard library only.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Layer:
    """One linear layer: ``y = x @ W^T`` with W of (n, k), x of (M, k)."""

    name: str
    n: int
    k: int


class ConfigError(ValueError):
    """The config lacks a key its model type needs, or has one of the wrong type."""


def _int(config: dict, key: str, source: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{source}: {key!r} must be a positive integer, got {value!r}")
    return value


def linear_layers(config: dict, source: str = "config") -> tuple[Layer, ...]:
    """The distinct linear layers of one decoder layer (attention projections and MLP) and the LM
    head. Gate and up projections are listed fused (N = 2 x intermediate), as serving stacks run
    them. DeepSeek-V3's multi-head latent attention (``kv_lora_rank``) has its own projections."""
    h = _int(config, "hidden_size", source)
    heads = _int(config, "num_attention_heads", source)
    layers = []
    if "kv_lora_rank" in config:
        q_rank, kv_rank = _int(config, "q_lora_rank", source), _int(config, "kv_lora_rank", source)
        nope, rope = _int(config, "qk_nope_head_dim", source), _int(config, "qk_rope_head_dim", source)
        v = _int(config, "v_head_dim", source)
        layers += [Layer("q_a_proj", q_rank, h), Layer("q_b_proj", heads * (nope + rope), q_rank),
                   Layer("kv_a_proj", kv_rank + rope, h), Layer("kv_b_proj", heads * (nope + v), kv_rank),
                   Layer("o_proj", h, heads * v)]
    else:
        kv_heads = _int(config, "num_key_value_heads", source) if "num_key_value_heads" in config else heads
        head_dim = _int(config, "head_dim", source) if "head_dim" in config else h // heads
        layers += [Layer("qkv_proj", (heads + 2 * kv_heads) * head_dim, h), Layer("o_proj", h, heads * head_dim)]
    inter = _int(config, "intermediate_size", source)
    layers += [Layer("gate_up_proj", 2 * inter, h), Layer("down_proj", h, inter)]
    if "moe_intermediate_size" in config:
        moe = _int(config, "moe_intermediate_size", source)
        layers += [Layer("expert_gate_up_proj", 2 * moe, h), Layer("expert_down_proj", h, moe)]
    if "vocab_size" in config:
        layers.append(Layer("lm_head", _int(config, "vocab_size", source), h))
    return tuple(layers)


def read_config(path: Path) -> dict:
    """A config.json as a dict; ConfigError naming the file if it is not a JSON object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a readable JSON config ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a model config is a JSON object, got {type(data).__name__}")
    return data


def token_grid(points: int = 32, largest: int = 16384, randoms: int = 16, seed: int = 2026) -> tuple[int, ...]:
    """Token counts from 1 to ``largest``: ``points`` on a geometric grid, rounded to integers (so
    most are not powers of two), and ``randoms`` drawn log-uniformly, all distinct and sorted."""
    grid = {max(1, round(largest ** (i / (points - 1)))) for i in range(points)}
    rng = random.Random(seed)
    while len(grid) < points + randoms:
        grid.add(max(1, round(math.exp(rng.uniform(0.0, math.log(largest))))))
    return tuple(sorted(grid))


def split_held_out(ms: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(tuning half, held-out half): alternate token counts, so each half spans the whole range and
    every held-out M lies between two tuned ones."""
    return ms[0::2], ms[1::2]


def shapes(layers: tuple[Layer, ...], ms: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """Every (M, N, K) of ``layers`` at the token counts ``ms``, without repeats, in order."""
    seen: dict[tuple[int, int, int], None] = {}
    for m in ms:
        for layer in layers:
            seen.setdefault((m, layer.n, layer.k))
    return list(seen)
