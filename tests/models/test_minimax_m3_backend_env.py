# SPDX-License-Identifier: Apache-2.0
"""The sparse backend's environment switches (registered in common/envs.py):
defaults, and a clear error for anything but 0 / 1.
  VLLM_MINIMAX_M3_FOLD_KV_SCALE (default 1): fold scalar FP8 KV scales.
  VLLM_MINIMAX_M3_ONE_LAUNCH_DECODE (default 0): fused top-k select and split
  merge in the Triton decode kernels.
  VLLM_MINIMAX_M3_SCORE_ATTEND_DECODE (default 1): small decode batches over short
  block tables in two launches (score_attend_decode).
  VLLM_MINIMAX_M3_PREFILL_TOKEN_TILE (unset: by context length): token tiles in the Triton
  prefill attention.
  VLLM_MINIMAX_M3_PREFILL_BLOCK_MAJOR (unset: by the number of prefill tokens): block-major
  Triton prefill attention.
"""

import pytest

SWITCHES = {"VLLM_MINIMAX_M3_FOLD_KV_SCALE": True,
            "VLLM_MINIMAX_M3_ONE_LAUNCH_DECODE": False,
            "VLLM_MINIMAX_M3_SCORE_ATTEND_DECODE": True}


@pytest.mark.parametrize("name", sorted(SWITCHES))
def test_switch(monkeypatch, name):
    from vllm.models.minimax_m3.common import envs

    default = SWITCHES[name]

    def read():
        return getattr(envs, name)
    monkeypatch.delenv(name, raising=False)
    assert read() is default
    for value, want in (("0", False), ("1", True)):
        monkeypatch.setenv(name, value)
        assert read() is want
    monkeypatch.setenv(name, "yes")
    with pytest.raises(ValueError, match=f"{name} must be 0 or 1, got 'yes'"):
        read()


def test_prefill_token_tile(monkeypatch):
    """VLLM_MINIMAX_M3_PREFILL_TOKEN_TILE (unset: the context-length rule):
    tokens per program of the tiled prefill attention, a power of two up to
    16, 0 or 1 for one token per program."""
    from vllm.models.minimax_m3.common import envs

    name = "VLLM_MINIMAX_M3_PREFILL_TOKEN_TILE"
    monkeypatch.delenv(name, raising=False)
    assert envs.VLLM_MINIMAX_M3_PREFILL_TOKEN_TILE is None
    for value in ("0", "1", "2", "4", "16"):
        monkeypatch.setenv(name, value)
        assert envs.VLLM_MINIMAX_M3_PREFILL_TOKEN_TILE == int(value)
    for value in ("3", "32", "-2", "four"):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=f"{name} must be 0 or a power of two"):
            envs.VLLM_MINIMAX_M3_PREFILL_TOKEN_TILE


def test_default_prefill_token_tile():
    """Token tiles only while the context is at most 4 x top-k sparse blocks
    (8 tokens per program with bf16 KV, 4 with fp8)."""
    from vllm.models.minimax_m3.common.triton_ops import default_prefill_token_tile as rule

    assert rule(8192, 128, 16, kv_fp8=False) == 8
    assert rule(8192, 128, 16, kv_fp8=True) == 4
    assert rule(8193, 128, 16, kv_fp8=False) == 0
    assert rule(32768, 128, 16, kv_fp8=True) == 0
    assert rule(100, 128, 16, kv_fp8=False) == 8
    assert rule(4096, 64, 16, kv_fp8=False) == 8 and rule(4097, 64, 16, kv_fp8=False) == 0
    assert rule(0, 128, 16, kv_fp8=False) == 0  # captured graphs: context unknown


def test_prefill_layout():
    """The engine's prefill layout: block-major (4 pairs per step) from 1024
    prefill tokens, token tiles by the context-length rule below that;
    decode-only batches one token per program; an environment setting wins
    (block-major first, then the token tile); block-major set to 0 leaves the
    token-tile rule."""
    from vllm.models.minimax_m3.common import backend
    from vllm.models.minimax_m3.common.triton_ops import default_prefill_layout as rule

    assert rule(1024, 131072, 128, 16, kv_fp8=False) == dict(token_tile=0, block_major=4)
    assert rule(1023, 4000, 128, 16, kv_fp8=False) == dict(token_tile=8, block_major=0)
    assert rule(1023, 40000, 128, 16, kv_fp8=True) == dict(token_tile=0, block_major=0)

    impl = backend.MiniMaxM3SparseImpl.__new__(backend.MiniMaxM3SparseImpl)
    impl.sparse_block, impl.topk_blocks = 128, 16
    impl.prefill_token_tile, impl.prefill_block_major = None, None

    def md(num_decode, max_seq_len, T=10):
        return backend.MiniMaxM3SparseMetadata(T, None, None, None, None, None,
                                               num_decode, max_seq_len)

    def layout(*a, kv_fp8=False, **kw):
        got = impl._prefill_layout(md(*a, **kw), kv_fp8=kv_fp8)
        return got["token_tile"], got["block_major"]
    assert layout(10, 4000) == (0, 0)  # decode only
    assert layout(3, 4000) == (8, 0)
    assert layout(3, 4000, kv_fp8=True) == (4, 0)
    assert layout(3, 40000) == (0, 0)
    assert layout(3, 40000, T=1027) == (0, 4)  # 1024 prefill tokens
    assert layout(3, 4000, T=1026) == (8, 0)
    impl.prefill_token_tile = 2
    assert layout(3, 40000) == (2, 0)
    assert layout(3, 40000, T=5000) == (2, 0)
    assert layout(10, 40000) == (0, 0)
    impl.prefill_block_major = 8  # set: replaces token tiles at any size
    assert layout(3, 4000) == (0, 8)
    assert layout(10, 4000) == (0, 0)
    impl.prefill_token_tile, impl.prefill_block_major = None, 0  # off: the token-tile rule
    assert layout(3, 4000, T=5000) == (8, 0)
    assert layout(3, 40000, T=5000) == (0, 0)


def test_prefill_block_major(monkeypatch):
    """VLLM_MINIMAX_M3_PREFILL_BLOCK_MAJOR (unset: the rule): (token, slot)
    pairs per step of the block-major prefill attention, a power of two up to
    16; 0 and 1 mean off."""
    from vllm.models.minimax_m3.common import envs

    name = "VLLM_MINIMAX_M3_PREFILL_BLOCK_MAJOR"
    monkeypatch.delenv(name, raising=False)
    assert envs.VLLM_MINIMAX_M3_PREFILL_BLOCK_MAJOR is None
    for value, want in (("0", 0), ("1", 0), ("2", 2), ("8", 8), ("16", 16)):
        monkeypatch.setenv(name, value)
        assert envs.VLLM_MINIMAX_M3_PREFILL_BLOCK_MAJOR == want
    for value in ("3", "32", "-2", "eight"):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=f"{name} must be 0 or a power of two"):
            envs.VLLM_MINIMAX_M3_PREFILL_BLOCK_MAJOR


def test_takes_score_attend():
    """The engine's decode path: ``score_attend_decode`` for decode-only
    batches that ``score_attend_fits`` (on CPU the SM
    count stand-in is 4: one token over a 4-block table); else the chain, and
    always the chain when the switch is off."""
    import torch

    from vllm.models.minimax_m3.common import backend

    impl = backend.MiniMaxM3SparseImpl.__new__(backend.MiniMaxM3SparseImpl)
    impl.sparse_block, impl.num_kv_heads, impl.score_attend = 32, 1, True

    def takes(T, num_decode, reqs=1, pages=8):
        md = backend.MiniMaxM3SparseMetadata(
            T, torch.zeros((reqs, pages), dtype=torch.int32), None, None, None, None,
            num_decode, 100)
        return impl._takes_score_attend(md, 16, torch.device("cpu"))
    assert takes(1, 1)  # 8 pages of 16 = 4 blocks of 32
    assert not takes(1, 0)  # a prefill token
    assert not takes(1, 1, pages=10)  # 5 blocks: 5 programs > 4 SMs
    assert not takes(2, 2, reqs=2)  # 8 programs
    assert not takes(0, 0)
    impl.score_attend = False
    assert not takes(1, 1)


def test_backend_names_say_what_runs():
    """The sparse layers' backends are named for the MSA path (Triton kernels
    on CUDA/ROCm, the PyTorch reference on CPU), not for one of them."""
    from vllm.models.minimax_m3.common import backend

    assert backend.MiniMaxM3SparseBackend.get_name() == "MINIMAX_M3_MSA"
    assert backend.MiniMaxM3IndexerBackend.get_name() == "MINIMAX_M3_MSA_INDEXER"


def test_knob_registry_is_documented_and_refuses_bad_values(monkeypatch):
    """Every knob of common/envs.py is documented in README.md or docs/, is
    read through the registry (no other ``VLLM_MINIMAX_M3_*`` environment read
    in the MSA code), and a value its parser refuses raises a ValueError that
    names the knob and the value."""
    import re
    from pathlib import Path

    from vllm.models.minimax_m3.common import envs

    repo = Path(__file__).resolve().parents[2]
    docs = (repo / "README.md").read_text() + "".join(
        p.read_text() for p in sorted((repo / "docs").rglob("*.md")))
    assert envs.environment_variables
    for name, knob in envs.environment_variables.items():
        assert name.startswith("VLLM_MINIMAX_M3_") and knob.doc, name
        assert f"`{name}`" in docs, f"{name} is not documented in README.md or docs/"
        monkeypatch.delenv(name, raising=False)
        getattr(envs, name)  # the default parses
        monkeypatch.setenv(name, "not-a-value")
        with pytest.raises(ValueError, match=f"{name} must be .*got 'not-a-value'"):
            getattr(envs, name)
    assert sorted(dir(envs)) == sorted(envs.environment_variables)
    with pytest.raises(AttributeError, match="registered knobs"):
        envs.VLLM_MINIMAX_M3_NO_SUCH_KNOB  # noqa: B018

    package = repo / "vllm_overlay" / "vllm" / "models" / "minimax_m3"
    for path in package.rglob("*.py"):
        if path.name == "envs.py":
            continue
        text = path.read_text()
        reads = re.findall(r"(?:environ(?:\.get\(|\[)|getenv\()\s*[\"'](VLLM_MINIMAX_M3_\w+)", text)
        assert not reads, f"{path.relative_to(repo)} reads {reads} past common/envs.py"
