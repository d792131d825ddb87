"""Tensor parallelism without communication: the layout of the ranks, the shard reader (only
the rank's rows or columns come from the safetensors file), and the one-line refusals. The
sharded forward's logits and outputs are checked on real gloo ranks in
tests_distributed/test_tp_ranks.py."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from lp.engine.tp import TensorGroup, check_divisible, held_bytes, load_sharded, shard
from lp.errors import LPError
from lp.mesh import Mesh, check_tp

SHAPE = dict(
    vocab_size=32,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Qwen2 (q/k/v biases) saved as safetensors, and the model itself."""
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE, tie_word_embeddings=False)).eval()
    path = tmp_path_factory.mktemp("qwen2")
    model.save_pretrained(path)
    return path, model


def test_layout_groups_consecutive_ranks():
    mesh = Mesh(6, 2)
    assert mesh.replicas == 3
    assert mesh.tp_groups() == [[0, 1], [2, 3], [4, 5]]
    assert mesh.lp_groups() == [[0, 2, 4], [1, 3, 5]]
    assert Mesh(4, 1).lp_groups() == [[0, 1, 2, 3]]


@pytest.mark.parametrize("tp", [0, -1, True, 1.5, "2"])
def test_bad_tp_is_one_line(tp):
    with pytest.raises(LPError, match=r"^tp must be auto or an integer >= 1, got"):
        check_tp(tp)


def test_tp_auto_is_accepted_and_resolved_before_a_mesh():
    check_tp("auto")
    with pytest.raises(LPError, match=r"^tp=auto is resolved to a number before the layout is built$"):
        Mesh(4, "auto")


def test_tp_must_divide_the_world():
    with pytest.raises(LPError, match=r"^tp=3 must divide the number of ranks \(4\)$"):
        Mesh(4, 3)


def test_indivisible_heads_name_the_counts():
    with pytest.raises(LPError) as e:
        check_divisible(LlamaConfig(**SHAPE), 3)
    assert str(e.value) == "tp=3 must divide the model's attention heads (4), KV heads (2) and intermediate size (48)"
    check_divisible(LlamaConfig(**SHAPE), 2)


@pytest.mark.parametrize("rank", [0, 1])
def test_reader_reads_only_the_shard(saved, rank):
    path, full = saved
    model = load_sharded(path, torch.float32, torch.device("cpu"), TensorGroup(rank, 2))
    got, want = model.model.layers[1], full.model.layers[1]
    half = slice(rank * 16, (rank + 1) * 16)  # 2 of 4 heads of 8 dims, 1 of 2 KV heads
    kv = slice(rank * 8, (rank + 1) * 8)
    mlp = slice(rank * 24, (rank + 1) * 24)
    assert torch.equal(got.self_attn.q_proj.weight, want.self_attn.q_proj.weight[half])
    assert torch.equal(got.self_attn.q_proj.bias, want.self_attn.q_proj.bias[half])
    assert torch.equal(got.self_attn.k_proj.weight, want.self_attn.k_proj.weight[kv])
    assert torch.equal(got.self_attn.v_proj.bias, want.self_attn.v_proj.bias[kv])
    assert torch.equal(got.self_attn.o_proj.weight, want.self_attn.o_proj.weight[:, half])
    assert torch.equal(got.mlp.gate_proj.weight, want.mlp.gate_proj.weight[mlp])
    assert torch.equal(got.mlp.up_proj.weight, want.mlp.up_proj.weight[mlp])
    assert torch.equal(got.mlp.down_proj.weight, want.mlp.down_proj.weight[:, mlp])
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
        assert torch.equal(model.get_parameter(name), full.get_parameter(name)), name
    assert not any(p.is_meta for p in model.parameters())
    assert all(not b.is_meta for b in model.buffers())
    split, whole = held_bytes(model, TensorGroup(rank, 2))
    full_split, full_whole = held_bytes(full, TensorGroup(rank, 2))
    assert (split * 2, whole) == (full_split, full_whole)


def test_cut_in_memory_equals_read(saved):
    path, full = saved
    read = load_sharded(path, torch.float32, torch.device("cpu"), TensorGroup(1, 2))
    copy = Qwen2ForCausalLM(full.config).eval()
    copy.load_state_dict(full.state_dict())
    cut = shard(copy, TensorGroup(1, 2))
    a, b = dict(read.named_parameters()), dict(cut.named_parameters())
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_tied_embeddings_stay_tied(tmp_path):
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**SHAPE, tie_word_embeddings=True)).save_pretrained(tmp_path)
    model = load_sharded(tmp_path, torch.float32, torch.device("cpu"), TensorGroup(0, 2))
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_row_parallel_bias_is_added_once(tmp_path):
    """A bias after o or down is kept by rank 0 only: the all-reduce then adds it once."""
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**SHAPE, attention_bias=True, mlp_bias=True)).save_pretrained(tmp_path)
    ranks = [load_sharded(tmp_path, torch.float32, torch.device("cpu"), TensorGroup(r, 2)) for r in (0, 1)]
    assert ranks[0].model.layers[0].self_attn.o_proj.bias is not None
    assert ranks[1].model.layers[0].self_attn.o_proj.bias is None
    assert ranks[1].model.layers[0].mlp.down_proj.bias is None
    assert ranks[1].model.layers[0].mlp.up_proj.bias.shape == (24,)
