"""The v0.26.0 flavor: upstream's MiniMax-M3 with the series' MSA ops, through vLLM's
engine on CPU, against transformers' MiniMax-M3 (the oracle)."""

import importlib.metadata
import json

import pytest
import torch
from conftest import REPO
from minimax_m3_utils import hf_greedy, hf_token_logprobs, run_vllm
from upstream_checkpoint import bf16_index_keys, build_upstream_checkpoint

from m3series.pin import BasePin
from m3series.series import Series

FLAVOR = "v0.26.0"
PROBE = """
def probe(model):
    return sorted({type(m.impl).__name__ for m in model.modules()
                   if type(m).__name__ in ("MiniMaxM3SparseAttention", "MiniMaxM3Indexer")})
"""


FP32_TOL = 1e-3   # fp32 engine against the fp32 oracle: measured ~1e-4 here


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_upstream_checkpoint(str(tmp_path_factory.mktemp("m3-upstream")))


def _llm_kwargs(**over):
    kw = dict(dtype="float32", block_size=128, max_model_len=1024, language_model_only=True,
              enable_prefix_caching=False, max_num_seqs=4)
    kw.update(over)
    return kw


def test_installed_cpu_build_is_this_flavor():
    import vllm

    tree = REPO / "build" / f"vllm-{FLAVOR}"
    stamp = json.loads((tree / ".git/m3-series.json").read_text())
    series = Series.load(REPO, FLAVOR)
    expected = (f"{BasePin.load(series.pin_path).version}+m3.g"
                f"{series.digest(stamp['base_ident'])[:10]}.cpu")
    assert vllm.__version__ == expected == importlib.metadata.version("vllm")


def test_engine_matches_transformers_with_sparse_selection_and_chunked_prefill(
        checkpoint, tmp_path):
    """Two prompts of 3 and 4 sparse blocks with top-2 selection (the selection is
    active), prefilled in 128-token chunks beside the other request's decode steps:
    every prompt position's logprob and the greedy continuation."""
    hf_dir, released = checkpoint
    prompts = [[3 + (7 * i) % 500 for i in range(300)], [5 + (11 * i) % 490 for i in range(430)]]
    res = run_vllm(str(tmp_path / "engine"), released, prompts, max_tokens=6, probe=PROBE,
                   prompt_logprobs=0,
                   llm_kwargs=_llm_kwargs(max_num_batched_tokens=128,
                                          enable_chunked_prefill=True))
    assert "error" not in res, res.get("traceback", "") + res.get("log", "")[-4000:]
    # both impls of every sparse layer are the series' (the knob's default)
    assert res["probe"] == ["MiniMaxM3IndexerSeriesImpl", "MiniMaxM3SparseSeriesImpl"]
    with bf16_index_keys() as hf_cls:
        model = hf_cls.from_pretrained(hf_dir, dtype=torch.float32).eval()
        for prompt, got in zip(prompts, res["rounds"][0]):
            ref = torch.tensor(hf_token_logprobs(model, prompt))
            diff = (torch.tensor(got["prompt_logprobs"][1:]) - ref).abs()
            assert diff.max().item() < FP32_TOL, (diff.max().item(), int(diff.argmax()))
            want, want_lp = hf_greedy(model, prompt, 6)
            assert got["tokens"] == want
            assert max(abs(a - b) for a, b in zip(got["logprobs"], want_lp)) < FP32_TOL


def test_upstream_kernels_are_refused_on_cpu_with_the_knob_named(checkpoint, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setenv("VLLM_MINIMAX_M3_MSA", "upstream")
    res = run_vllm(str(tmp_path / "engine"), checkpoint[1], [[3, 4, 5]], max_tokens=1,
                   llm_kwargs=_llm_kwargs())
    text = res.get("error", "") + res.get("traceback", "") + res.get("log", "")
    assert "VLLM_MINIMAX_M3_MSA=upstream selects vLLM's Triton MSA kernels" in text, text[-3000:]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_series_kv_view_reads_upstreams_packed_cache(layout):
    """Upstream's cache is logical [pages, Hkv, page, 2 D] (K then V per row) with
    NHD or HND strides; the series' kernels read it as [pages, 2, page, Hkv, D]."""
    from vllm.models.minimax_m3.common.series_msa import series_kv_view

    pages, hkv, page, d = 3, 2, 8, 4
    if layout == "NHD":
        cache = torch.randn(pages, page, hkv, 2 * d).permute(0, 2, 1, 3)
    else:
        cache = torch.randn(pages, hkv, page, 2 * d)
    view = series_kv_view(cache)
    assert view.shape == (pages, 2, page, hkv, d)
    assert torch.equal(view[:, 0], cache[..., :d].permute(0, 2, 1, 3))
    assert torch.equal(view[:, 1], cache[..., d:].permute(0, 2, 1, 3))
    view[1, 1, 5, 0, 2] = 42.0          # the same memory, not a copy
    assert cache[1, 0, 5, d + 2] == 42.0


@pytest.mark.parametrize("query_len", [1, 3])
def test_decode_layout_one_token_per_request_matches_the_general_rule(query_len):
    """Token t of a uniform decode batch belongs to request t // query_len at position
    seq_len - query_len + t % query_len; the one-token-per-request path (two launches)
    gives exactly that, as int32 on the metadata's device."""
    from vllm.models.minimax_m3.common.series_msa import decode_layout

    seq_lens = torch.tensor([5, 130, 1, 4097], dtype=torch.int32)
    tokens = seq_lens.numel() * query_len
    req, pos = decode_layout(seq_lens, tokens, query_len)
    t = torch.arange(tokens)
    want_req = t // query_len
    want_pos = (seq_lens.long()[want_req] - query_len + t % query_len).clamp(min=0)
    assert req.dtype == pos.dtype == torch.int32
    assert req.tolist() == want_req.tolist() and pos.tolist() == want_pos.tolist()
    # a decode batch shorter than the cached arange, then one longer: still [0, n)
    assert decode_layout(seq_lens[:2], 2, 1)[0].tolist() == [0, 1]
    long = torch.full((3000,), 7, dtype=torch.int32)
    assert decode_layout(long, 3000, 1)[0].tolist() == list(range(3000))


def test_token_maps_are_built_once_per_metadata_object(monkeypatch):
    """Every sparse layer's indexer and attention call _parts on the same metadata
    object in a step: the maps are built on the first call only, while the block
    tables are read afresh; a copy of the metadata (vLLM swaps block tables on
    copies) builds its own."""
    import copy
    from types import SimpleNamespace

    from vllm.models.minimax_m3.common import series_msa

    builds = []
    real = series_msa._token_maps
    monkeypatch.setattr(series_msa, "_token_maps",
                        lambda md: builds.append(id(md)) or real(md))
    md = SimpleNamespace(
        num_decodes=2, num_decode_tokens=2, num_prefills=1, num_actual_tokens=5,
        decode=SimpleNamespace(seq_lens=torch.tensor([9, 3], dtype=torch.int32),
                               decode_query_len=1, block_table=torch.zeros(2, 4)),
        prefill=SimpleNamespace(cu_seqlens_q=torch.tensor([0, 3], dtype=torch.int32),
                                seq_lens=torch.tensor([10], dtype=torch.int32),
                                block_table=torch.ones(1, 4)))
    first = series_msa._parts(md)
    for _ in range(5):  # the other layers' calls
        again = series_msa._parts(md)
    assert len(builds) == 1
    (d, d0, d1, dbt, dreq, dpos), (p, p0, p1, pbt, preq, ppos) = again
    assert (d, d0, d1, p, p0, p1) == (True, 0, 2, False, 2, 5)
    assert dreq.tolist() == [0, 1] and dpos.tolist() == [8, 2]
    assert preq.tolist() == [0, 0, 0] and ppos.tolist() == [7, 8, 9]
    assert all(a[4] is b[4] and a[5] is b[5] for a, b in zip(first, again))
    swapped = copy.copy(md)
    swapped.decode = SimpleNamespace(**vars(md.decode), )
    swapped.decode.block_table = torch.full((2, 4), 3.0)
    parts = series_msa._parts(swapped)
    assert len(builds) == 2 and parts[0][3] is swapped.decode.block_table
    assert series_msa._parts(md)[0][3] is md.decode.block_table and len(builds) == 2



@pytest.mark.parametrize("rocm", [False, True], ids=["nvidia-token-major", "amd-head-major"])
def test_series_reads_the_topk_buffer_token_major_on_both_models(monkeypatch, rocm):
    """The series' ops read and write the shared top-k buffer token-major
    (`token_major_topk`): the NVIDIA model's buffer [tokens, heads, top-k] as it is,
    the AMD model's [heads, tokens, top-k] as a transposed view of the same memory."""
    from vllm.models.minimax_m3.common import series_msa, sparse_attention

    monkeypatch.setattr(sparse_attention.current_platform, "is_rocm", lambda: rocm)
    tokens, heads, k = 12, 4, 3
    buf = torch.arange(tokens * heads * k, dtype=torch.int32)
    buf = buf.view(heads, tokens, k) if rocm else buf.view(tokens, heads, k)
    view = series_msa.token_major_topk(buf)
    assert view.shape == (tokens, heads, k) and view.data_ptr() == buf.data_ptr()
    assert torch.equal(view, buf.transpose(0, 1) if rocm else buf)
    assert series_msa.token_major_topk(None) is None


def test_aiter_shuffled_kv_cache_takes_upstreams_path(monkeypatch):
    """With AITER's sparse paged attention requested on ROCm the K/V cache is laid out
    shuffled for AITER's kernels, which the series' kernels cannot read: the default
    then selects upstream's path, and an explicit VLLM_MINIMAX_M3_MSA=series is refused
    naming both ways out."""
    from vllm.models.minimax_m3.common import series_msa

    monkeypatch.delenv("VLLM_MINIMAX_M3_MSA", raising=False)
    assert series_msa.series_msa_selected()                      # the default elsewhere
    monkeypatch.setattr(series_msa, "_minimax_m3_aiter_sparse_pa_requested", lambda: True)
    assert not series_msa.series_msa_selected()
    monkeypatch.setenv("VLLM_MINIMAX_M3_MSA", "series")
    with pytest.raises(ValueError, match="VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=0 to serve"):
        series_msa.series_msa_selected()
