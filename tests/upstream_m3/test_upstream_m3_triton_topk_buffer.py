"""Upstream's Triton MSA path reads the shared top-k buffer in the layout the model
allocates (v0.26.0 entry `read-the-token-major-top-k-buffer-head-major-in-the-triton-i`,
the fix of vllm#49149).

vLLM v0.26.0's NVIDIA MiniMax-M3 allocates the buffer token-major [tokens, index
heads, top-k]; its Triton indexer and attention indexed it head-major. With more
decode tokens than index heads (4 per rank at TP1) (head, token) rows aliased, and in
a mixed batch with at least 4 decode tokens the prefill's view was empty, a null
pointer the top-k kernel wrote through: the illegal memory access of side A of the
serving matrix at 8k x 8 and 32k x 8 (H100, 2026-12-05). Before the fix these three
cases, run here on CPU through Triton's interpreter, gave NaN, a 0.40 error and a
segmentation fault. They also check upstream's path against the series' on one
layer (the op-level half of the A-vs-B comparison)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).with_name("upstream_triton_on_cpu.py")
DECODES = "300,450,600,380,520,640,330,410"   # 8 decode tokens, 3-5 blocks each, top-2


@pytest.mark.parametrize("decodes, prefills", [
    (DECODES, ""),          # more decode tokens than index heads: rows aliased
    ("300", "200+16"),      # 1 decode + 1 prefill: the prefill overwrote decode rows
    (DECODES, "200+16"),    # >= 4 decodes + a prefill: a null top-k pointer (crash)
], ids=["decode-8", "mixed-1-decode", "mixed-8-decodes"])
def test_upstream_triton_path_matches_the_series_on_the_models_buffer(decodes, prefills):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, str(SCRIPT), decodes, prefills], env=env,
                         capture_output=True, text=True, timeout=600)
    tail = (run.stdout + run.stderr)[-3000:]
    assert run.returncode == 0, f"exit status {run.returncode} (negative: a signal)\n{tail}"
    assert "max |upstream - series|" in run.stdout, tail


@pytest.mark.parametrize("rocm", [False, True], ids=["nvidia-token-major", "amd-head-major"])
def test_head_major_view_of_the_models_buffer_never_aliases(monkeypatch, rocm):
    """`topk_buffer_head_major` gives [heads, tokens, top-k] over either model's
    allocation (NVIDIA [tokens, heads, top-k], AMD [heads, tokens, top-k]): a view of
    the one buffer in which every (head, token) row is its own memory, and the part
    after 8 decode tokens is not empty."""
    from vllm.models.minimax_m3.common import sparse_attention

    monkeypatch.setattr(sparse_attention.current_platform, "is_rocm", lambda: rocm)
    tokens, heads, k = 12, 4, 3
    buf = torch.zeros((heads, tokens, k) if rocm else (tokens, heads, k), dtype=torch.int32)
    view = sparse_attention.topk_buffer_head_major(buf)
    assert view.shape == (heads, tokens, k) and view.data_ptr() == buf.data_ptr()
    for h in range(heads):
        for t in range(tokens):
            view[h, t] = torch.tensor([h, t, -1], dtype=torch.int32)
    rows = {tuple(r) for r in view.reshape(-1, k).tolist()}
    assert len(rows) == heads * tokens            # nothing overwrote another row
    assert int((buf == -1).sum()) == heads * tokens
    assert view[:, 8:, :].shape == (heads, tokens - 8, k)
    assert sparse_attention.topk_buffer_head_major(None) is None
