"""Model configs to GEMM shapes, and the token grid with its held-out half (tilekiln/tuning/models.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tilekiln.tuning.models import ConfigError, Layer, linear_layers, read_config, shapes, split_held_out, token_grid

MODELS = Path(__file__).resolve().parents[2] / "bench" / "models"


def layers(name: str) -> dict[str, tuple[int, int]]:
    return {layer.name: (layer.n, layer.k) for layer in linear_layers(read_config(MODELS / f"{name}.json"))}


def test_grouped_query_attention_and_mlp_layers_of_llama_3_8b():
    assert layers("llama-3-8b") == {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096),
                                    "down_proj": (4096, 14336), "lm_head": (128256, 4096)}


def test_an_explicit_head_dim_wins_over_hidden_over_heads():
    gemma = layers("gemma-2-9b")  # 16 heads of 256, not 3584 / 16
    assert gemma["qkv_proj"] == (8192, 3584) and gemma["o_proj"] == (3584, 4096)


def test_deepseek_v3_latent_attention_projections_and_experts():
    ds = layers("deepseek-v3")
    assert ds["q_a_proj"] == (1536, 7168) and ds["q_b_proj"] == (24576, 1536)
    assert ds["kv_a_proj"] == (576, 7168) and ds["kv_b_proj"] == (32768, 512) and ds["o_proj"] == (7168, 16384)
    assert ds["expert_gate_up_proj"] == (4096, 7168) and ds["expert_down_proj"] == (7168, 2048)


def test_every_bundled_config_reads():
    configs = sorted(MODELS.glob("*.json"))
    assert len(configs) >= 6
    for path in configs:
        assert all(layer.n > 0 and layer.k > 0 for layer in linear_layers(read_config(path), str(path)))


def test_a_bad_config_names_the_file_and_the_key(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text(json.dumps({"hidden_size": 4096, "num_attention_heads": "32", "intermediate_size": 1}))
    with pytest.raises(ConfigError, match=r"broken\.json: 'num_attention_heads' must be a positive integer"):
        linear_layers(read_config(path), str(path))
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="a model config is a JSON object"):
        read_config(path)


def test_the_token_grid_spans_1_to_16384_mostly_off_powers_of_two():
    grid = token_grid()
    assert grid[0] == 1 and grid[-1] == 16384 and len(grid) >= 40 and list(grid) == sorted(set(grid))
    assert sum(m & (m - 1) != 0 for m in grid) > len(grid) // 2


def test_the_held_out_half_lies_between_tuned_token_counts():
    tuning, held_out = split_held_out(token_grid())
    assert not set(tuning) & set(held_out) and len(tuning) + len(held_out) == len(token_grid())
    for m in held_out[:-1]:
        assert any(t < m for t in tuning) and any(t > m for t in tuning), m


def test_tune_from_a_model_measures_only_the_tuning_half():
    from tilekiln.tune import model_shapes

    tuned_ms = {m for m, _, _ in model_shapes([MODELS / "llama-3-8b.json"])}
    tuning, held_out = split_held_out(token_grid())
    assert tuned_ms == set(tuning) and not tuned_ms & set(held_out)
    assert shapes((Layer("x", 8, 16), Layer("y", 8, 16)), (1, 2)) == [(1, 8, 16), (2, 8, 16)]
