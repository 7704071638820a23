# SPDX-License-Identifier: Apache-2.0
"""Compile the MSA attention kernels for an H100/H200 (sm_90) without a GPU:
Triton's front end, its GPU passes, PTX and ``ptxas`` (shipped in the triton
wheel), for every KV scale mode and the launch variants the engine uses.
The interpreter runs the kernels' Python semantics only; this catches what
only compilation sees (typing of jit-function returns, layouts, register
allocation failures).  The signature building is ``kernel_compile.py``'s,
shared with ``rocm_compile.py``.  Run by ``test_minimax_m3_sm90_compile.py`` in a
process without ``TRITON_INTERPRET``; prints one line per compiled kernel.
``SM90_PTX_DIGESTS=FILE`` also writes each kernel's PTX code digest: the
same digests before and after a refactor mean the same code.
"""

import os
import sys

assert not os.environ.get("TRITON_INTERPRET"), "run without TRITON_INTERPRET"

from kernel_compile import SM90 as TARGET, compile_source, kernel_source  # noqa: E402
from vllm.models.minimax_m3.common.triton_ops.attention import GROUP_BLOCK  # noqa: E402
from vllm.models.minimax_m3.common.triton_ops.block_major_group import (  # noqa: E402
    block_major_rank_kernel, block_major_scatter_kernel)
from vllm.models.minimax_m3.common.triton_ops.index_score_decode import (  # noqa: E402
    index_block_max_decode_kernel)
from vllm.models.minimax_m3.common.triton_ops.index_topk_prefill import (  # noqa: E402
    index_topk_prefill_kernel)
from vllm.models.minimax_m3.common.triton_ops.index_topk_select import (  # noqa: E402
    block_topk_select_kernel)
from vllm.models.minimax_m3.common.triton_ops.score_attend_decode import (  # noqa: E402
    score_attend_block_kernel, score_attend_merge_kernel)
from vllm.models.minimax_m3.common.triton_ops.sparse_attn_merge import (  # noqa: E402
    sparse_attn_merge_kernel)
from vllm.models.minimax_m3.common.triton_ops.sparse_attn_block_major import (  # noqa: E402
    sparse_attn_block_major_kernel)
from vllm.models.minimax_m3.common.triton_ops.sparse_attn_block_major_sm90 import (  # noqa: E402
    sparse_attn_block_major_sm90_kernel)
from vllm.models.minimax_m3.common.triton_ops.index_score_prefill_sm90 import (  # noqa: E402
    MAX_REGISTERS as SM90_INDEX_REGISTERS, NUM_WARPS as SM90_INDEX_WARPS,
    index_block_max_prefill_sm90_kernel)
from vllm.models.minimax_m3.common.triton_ops.sparse_attn_fwd import (  # noqa: E402
    sparse_attn_fwd_kernel)
from vllm.models.minimax_m3.common.triton_ops.sparse_attn_tiled import (  # noqa: E402
    sparse_attn_tiled_kernel)


def compile_kernel(kernel, pointers, constexprs, num_warps, num_stages=None, **options):
    compiled = compile_source(kernel_source(kernel, pointers, constexprs), TARGET, dict(
        num_warps=num_warps, num_stages=num_stages or 2, **options))
    print(f"  {kernel.fn.__name__}: {resource_usage(compiled.asm['ptx'])}, "
          f"{compiled.metadata.shared} B shared, {f2f_count(compiled.asm['cubin'])} F2F",
          flush=True)
    if os.environ.get("SM90_PTX_DIGESTS"):
        with open(os.environ["SM90_PTX_DIGESTS"], "a") as f:
            f.write(f"{kernel.fn.__name__} {ptx_code_digest(compiled.asm['ptx'])}\n")
    return compiled.asm["cubin"]


def ptx_code_digest(ptx: str) -> str:
    """sha256 of the PTX's code: without the debug sections, source locations,
    debug scope labels and comments, which move with any edit of the Python
    source.  Equal digests before and after a refactor of the kernels' helpers
    mean the same machine code (``SM90_PTX_DIGESTS=FILE`` appends one line per
    kernel)."""
    import hashlib
    code = ptx.split("\t.section\t.debug")[0]
    # ``$L__tmpN:`` labels mark inlined helpers' scopes for the debug sections only
    lines = (ln for ln in code.splitlines()
             if not ln.strip().startswith((".loc", ".file", "//", "$L__tmp")))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def f2f_count(cubin: bytes) -> int:
    """How many F2F instructions the SASS has: conversions on the conversion
    unit (16 per clock per SM on sm_90), e.g. fp8 -> bf16 taken directly
    (``_attend.widen_to`` goes through float32 instead); the triton wheel's
    cuobjdump disassembles."""
    import subprocess
    import tempfile
    from triton.backends.nvidia.compiler import get_ptxas
    cuobjdump = os.path.join(os.path.dirname(get_ptxas(90).path), "cuobjdump")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        sass = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True,
                              check=True).stdout
    return sum(1 for ln in sass.splitlines() if " F2F." in ln or " F2F " in ln)


def resource_usage(ptx: str) -> str:
    """ptxas's register and spill report for the kernel (the triton wheel's ptxas)."""
    import subprocess
    import tempfile
    from triton.backends.nvidia.compiler import get_ptxas
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        res = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", src,
                              "-o", os.path.join(d, "k.cubin")], capture_output=True, text=True)
    lines = [ln.split("info    : ")[-1] for ln in (res.stdout + res.stderr).splitlines()
             if "registers" in ln or "spill" in ln]
    return "; ".join(lines) or "ptxas said nothing"


def main():
    done = 0
    for mode in (0, 1, 2, 3):
        ptrs = dict(q_ptr="*bf16", kv_ptr="*bf16" if mode == 0 else "*fp8e4nv",
                    bt_ptr="*i32", req_ptr="*i32", pos_ptr="*i32", topk_ptr="*i32",
                    out_ptr="*bf16", part_o_ptr="*fp32", part_lse_ptr="*fp32",
                    k_scale_ptr="*fp32", v_scale_ptr="*fp32", kvs_ptr="*fp32",
                    cnt_ptr="*i32", pair_tok_ptr="*i32", pair_slot_ptr="*i32",
                    group_start_ptr="*i32", counts_ptr="*i32", tile_end_ptr="*i32")
        shape = dict(G=16, G_PAD=16, D=128, D_PAD=128, SPARSE_BLOCK=128, BLOCK_N=128,
                     PAGE_SIZE=64, SCALE_MODE=mode, IEEE=False, FP16_MMA=mode != 0)
        variants = [
            (sparse_attn_fwd_kernel, dict(TOPK=16, SLOTS=16, NUM_SPLITS=1,
                                          FUSED_MERGE=False, S_PAD=2, PREFETCH_ROWS=False), 4),
            (sparse_attn_fwd_kernel, dict(TOPK=16, SLOTS=4, NUM_SPLITS=4,
                                          FUSED_MERGE=True, S_PAD=4, PREFETCH_ROWS=False), 4),
            (sparse_attn_fwd_kernel, dict(TOPK=16, SLOTS=16, NUM_SPLITS=1,
                                          FUSED_MERGE=False, S_PAD=2, PREFETCH_ROWS=True), 4),
            # decode launch with programmatic dependent launch (griddepcontrol)
            (sparse_attn_fwd_kernel, dict(TOPK=16, SLOTS=2, NUM_SPLITS=8,
                                          FUSED_MERGE=False, S_PAD=8, PREFETCH_ROWS=False,
                                          PDL=True), 4),
            (sparse_attn_tiled_kernel, dict(TM=4, TOPK=16, TOPK_PAD=16), 4),
            # small decode batches with an fp8 cache: 8 warps
            (sparse_attn_fwd_kernel, dict(TOPK=16, SLOTS=1, NUM_SPLITS=16,
                                          FUSED_MERGE=False, S_PAD=16, PREFETCH_ROWS=False,
                                          PDL=True), 8),
            # each selected block split in two key ranges (``key_split``, decode)
            (sparse_attn_fwd_kernel, dict(TOPK=16, SLOTS=1, NUM_SPLITS=32, BLOCK_N=64,
                                          KEY_SPLIT=2, FUSED_MERGE=False, S_PAD=32,
                                          PREFETCH_ROWS=False), 8),
            # block-major prefill: 64 (token, slot) pairs per program, 4 or 8 per step
            (sparse_attn_block_major_kernel, dict(HQ=16, HKV=1, TM=4, CHUNK=64, TOPK=16), 4),
            (sparse_attn_block_major_kernel, dict(HQ=16, HKV=1, TM=8, CHUNK=64, TOPK=16), 8),
            # each step's rows loaded during the step before; the groups split by
            # whether their pairs see the whole block (the engine's launch for bf16)
            (sparse_attn_block_major_kernel, dict(HQ=16, HKV=1, TM=4, CHUNK=64, TOPK=16,
                                                  PREFETCH_PAIRS=True, SPLIT_MASKED=True), 4),
            # ``query_mma`` (with scalar fp8 scales): an fp8 block converted to bf16
            # once, the MMA in bf16; the pair rows but not the query rows prefetched
            # (v_scale in the kernel), or (the default) both, v_scale in the merge
            (sparse_attn_block_major_kernel, dict(HQ=16, HKV=1, TM=4, CHUNK=64, TOPK=16,
                                                  PREFETCH_PAIRS=True, PREFETCH_QUERY=False,
                                                  FP16_MMA=False), 4),
            (sparse_attn_block_major_kernel, dict(HQ=16, HKV=1, TM=4, CHUNK=64, TOPK=16,
                                                  PREFETCH_PAIRS=True, PREFETCH_QUERY=True,
                                                  FP16_MMA=False, V_SCALE_IN_MERGE=True,
                                                  SPLIT_MASKED=True), 4),
            # per-token-head scales (mode 2 only) multiplied into the held block once
            (sparse_attn_block_major_kernel, dict(HQ=16, HKV=1, TM=4, CHUNK=64, TOPK=16,
                                                  PREFETCH_PAIRS=True, PREFETCH_QUERY=True,
                                                  FP16_MMA=False, SCALE_HELD_KV=True,
                                                  SPLIT_MASKED=True), 4),
            # K/V loaded again each step (shared memory through the pipeline)
            (sparse_attn_block_major_kernel, dict(HQ=16, HKV=1, TM=4, CHUNK=64, TOPK=16,
                                                  HOLD_KV=False), 4),
            (sparse_attn_block_major_kernel, dict(HQ=16, HKV=1, TM=8, CHUNK=64, TOPK=16,
                                                  HOLD_KV=False), 8),
            (sparse_attn_tiled_kernel, dict(TM=8, TOPK=16, TOPK_PAD=16), 8),
        ]
        for kernel, extra, warps in variants:
            # the variants of one scale mode only
            if (extra.get("SCALE_HELD_KV") and mode != 2
                    or extra.get("V_SCALE_IN_MERGE") and mode != 1):
                continue
            # the block-major partials are fp16 for a bf16 model (the split ones fp32)
            kptrs = (dict(ptrs, part_o_ptr="*fp16") if kernel is sparse_attn_block_major_kernel
                     else ptrs)
            # block-major runs with one pipeline stage (attention._block_major_attention)
            stages = 1 if kernel is sparse_attn_block_major_kernel else None
            cubin = compile_kernel(kernel, kptrs, dict(shape, **extra), warps, stages)
            assert len(cubin) > 0
            print(f"compiled {kernel.fn.__name__} mode {mode} {extra} ({len(cubin)} B cubin)",
                  flush=True)
            done += 1
    # the sm_90 (Gluon) block-major kernel as the engine launches it on an H200: bf16
    # with a ring of 2 query tiles, fp8 (scalar / per-token-head scales) with 3
    for mode, kv, ring in ((0, "*bf16", 2), (1, "*fp8e4nv", 3), (2, "*fp8e4nv", 3)):
        ptrs = dict(q_ptr="*bf16", kv_ptr=kv, bt_ptr="*i32", req_ptr="*i32", pos_ptr="*i32",
                    pair_tok_ptr="*i32", pair_slot_ptr="*i32", group_start_ptr="*i32",
                    counts_ptr="*i32", tile_end_ptr="*i32", part_o_ptr="*fp16",
                    part_lse_ptr="*fp32", k_scale_ptr="*fp32", kvs_ptr="*fp32")
        cubin = compile_kernel(sparse_attn_block_major_sm90_kernel, ptrs, dict(
            HQ=16, HKV=1, G=16, G_PAD=16, TM=4, CHUNK=64, D=128, TOPK=16, SPARSE_BLOCK=128,
            PAGE_SIZE=64, SCALE_MODE=mode, SPLIT_MASKED=True, NUM_BUF=ring), 4)
        assert len(cubin) > 0
        print(f"compiled sparse_attn_block_major_sm90_kernel mode {mode} NUM_BUF={ring} "
              f"({len(cubin)} B cubin)", flush=True)
        done += 1
    # the sm_90 (Gluon) prefill index scoring as the engine launches it on an H200
    # (a ring of 2 key tiles) and with 3
    for ring in (2, 3):
        ptrs = dict(q_ptr="*bf16", k_ptr="*bf16", bt_ptr="*i32", req_ptr="*i32",
                    pos_ptr="*i32", scores_ptr="*fp32")
        cubin = compile_kernel(index_block_max_prefill_sm90_kernel, ptrs, dict(
            D=128, SPARSE_BLOCK=128, BLOCK_M=16 * SM90_INDEX_WARPS, PAGE_SIZE=64, LOCAL=1,
            INIT=1, SPLITS=8, MIN_SPLIT_BLOCKS=8, NUM_BUF=ring), SM90_INDEX_WARPS,
            maxnreg=SM90_INDEX_REGISTERS)
        assert len(cubin) > 0
        print(f"compiled index_block_max_prefill_sm90_kernel NUM_BUF={ring} "
              f"({len(cubin)} B cubin)", flush=True)
        done += 1
    # the decode attention that ranks its token's block scores itself (select_topk),
    # 64 blocks (8k context), 8 splits, PDL
    ptrs = dict(q_ptr="*bf16", kv_ptr="*bf16", bt_ptr="*i32", req_ptr="*i32", pos_ptr="*i32",
                topk_ptr="*fp32", out_ptr="*bf16", part_o_ptr="*fp32", part_lse_ptr="*fp32",
                k_scale_ptr="*fp32", v_scale_ptr="*fp32", kvs_ptr="*fp32", cnt_ptr="*i32")
    cubin = compile_kernel(sparse_attn_fwd_kernel, ptrs,
                           dict(G=16, G_PAD=16, D=128, D_PAD=128, SPARSE_BLOCK=128, BLOCK_N=128,
                                PAGE_SIZE=64, SCALE_MODE=0, IEEE=False, FP16_MMA=False,
                                TOPK=16, SLOTS=2, NUM_SPLITS=8, S_PAD=8, PDL=True,
                                SELECT_RANK=True, SELECT_NB=64, NB_PAD=64, RANK_COLS=64), 4)
    assert len(cubin) > 0
    print(f"compiled sparse_attn_fwd_kernel SELECT_RANK ({len(cubin)} B cubin)", flush=True)
    done += 1
    # the block-major grouping (a counting sort of the chunk's (token, slot) pairs)
    ptrs = dict(topk_ptr="*i32", req_ptr="*i32", pos_ptr="*i32", pair_key_ptr="*i32",
                pair_rank_ptr="*i32", counts_ptr="*i32", group_start_ptr="*i32",
                pair_tok_ptr="*i32", pair_slot_ptr="*i32")
    for kernel, extra in ((block_major_rank_kernel, dict(AGGREGATE=True, SPLIT_MASKED=True,
                                                         SPARSE_BLOCK=128)),
                          (block_major_rank_kernel, dict(AGGREGATE=False)),
                          (block_major_scatter_kernel, {})):
        cubin = compile_kernel(kernel, ptrs, dict(HKV=1, TOPK=16, BLOCK=GROUP_BLOCK, **extra), 4)
        assert len(cubin) > 0
        print(f"compiled {kernel.fn.__name__} {extra} ({len(cubin)} B cubin)", flush=True)
        done += 1
    # the prefill index at the engine's launch shape (128 rows per tile, 4 warps),
    # bf16 and fp8 index keys, with and without the pages resolved one block ahead
    # (and the default: each tile's splits divide the blocks its rows see)
    for k_scaled, prefetch, skip, visible in (
            (False, False, False, False), (True, False, False, False),
            (False, True, False, False), (True, True, False, False),
            (False, True, True, False), (True, True, True, False),
            (False, True, True, True), (True, True, True, True)):
        ptrs = dict(q_ptr="*bf16", k_ptr="*fp8e4nv" if k_scaled else "*bf16", ks_ptr="*fp32",
                    bt_ptr="*i32", req_ptr="*i32", pos_ptr="*i32", out_ids_ptr="*i32",
                    cand_v_ptr="*fp32")
        shape = dict(D=128, D_PAD=128, TOPK=16, TOPK_PAD=16, SPARSE_BLOCK=128, BLOCK_N=128,
                     BLOCK_M=128, PAGE_SIZE=64, LOCAL=1, INIT=1, SPLITS=4,
                     K_SCALED=k_scaled, IEEE=False, PREFETCH_ROWS=prefetch,
                     SKIP_FULL_MASK=skip, SPLIT_VISIBLE=visible)
        cubin = compile_kernel(index_topk_prefill_kernel, ptrs, shape, 4)
        assert len(cubin) > 0
        print(f"compiled index_topk_prefill_kernel K_SCALED={k_scaled} PREFETCH_ROWS={prefetch} "
              f"SKIP_FULL_MASK={skip} SPLIT_VISIBLE={visible} "
              f"({len(cubin)} B cubin)", flush=True)
        done += 1
    # the decode index scoring, bf16 and fp8 index keys (fp16 dot with fp8)
    for k_dtype in ("*bf16", "*fp8e4nv"):
        ptrs = dict(q_ptr="*bf16", k_ptr=k_dtype, ks_ptr="*fp32", bt_ptr="*i32", req_ptr="*i32",
                    pos_ptr="*i32", out_ptr="*fp32", sel_ptr="*i32", cnt_ptr="*i32")
        shape = dict(H=1, H_PAD=16, D=128, D_PAD=128, SPARSE_BLOCK=128, BLOCK_N=128,
                     BLOCKS_PER_PROG=1, PAGE_SIZE=64, LOCAL=1, INIT=1,
                     K_SCALED=k_dtype != "*bf16", IEEE=False, FUSED_SELECT=False, TOPK=16,
                     TOPK_PAD=16, CHUNK=16, SINGLE_CHUNK=True, DEC_STAGES=0)
        for pdl in (False, True):
            cubin = compile_kernel(index_block_max_decode_kernel, ptrs, dict(shape, PDL=pdl), 4)
            assert len(cubin) > 0
            print(f"compiled index_block_max_decode_kernel keys {k_dtype} PDL={pdl} "
                  f"({len(cubin)} B cubin)", flush=True)
            done += 1
    # the fused select (the last scoring program ranks its token's row of 64 blocks)
    cubin = compile_kernel(index_block_max_decode_kernel, dict(ptrs, k_ptr="*bf16"),
                           dict(shape, K_SCALED=False, FUSED_SELECT=True, CHUNK=64,
                                RANK=True, RANK_COLS=64, PDL=True), 4)
    assert len(cubin) > 0
    print(f"compiled index_block_max_decode_kernel FUSED_SELECT RANK ({len(cubin)} B cubin)",
          flush=True)
    done += 1
    # fp8 index keys at batch-32 sizes: 8 blocks per program, two per key load, pipelined
    cubin = compile_kernel(index_block_max_decode_kernel, dict(ptrs, k_ptr="*fp8e4nv"),
                           dict(shape, K_SCALED=True, BLOCKS_PER_PROG=8, TILE_BLOCKS=2,
                                DEC_STAGES=2), 4)
    assert len(cubin) > 0
    print(f"compiled index_block_max_decode_kernel fp8 keys TILE_BLOCKS=2 ({len(cubin)} B cubin)",
          flush=True)
    done += 1
    # the rest of the decode chain with programmatic dependent launch
    cubin = compile_kernel(block_topk_select_kernel, dict(vals_ptr="*fp32", ids_ptr="*fp32",
                                                          pos_ptr="*i32", out_ptr="*i32"),
                           dict(TOPK=16, TOPK_PAD=16, CHUNK=1024, SPARSE_BLOCK=128,
                                HAS_IDS=False, VALID_FROM_POS=True, SINGLE_CHUNK=True,
                                PDL=True), 4)
    assert len(cubin) > 0
    # the decode top-k by rank: 64 blocks (8k context) and 256 (32k)
    for chunk, warps in ((64, 1), (256, 2)):
        cubin = compile_kernel(block_topk_select_kernel, dict(vals_ptr="*fp32", ids_ptr="*fp32",
                                                              pos_ptr="*i32", out_ptr="*i32"),
                               dict(TOPK=16, TOPK_PAD=16, CHUNK=chunk, SPARSE_BLOCK=128,
                                    HAS_IDS=False, VALID_FROM_POS=True, SINGLE_CHUNK=True,
                                    PDL=True, RANK=True, RANK_COLS=min(chunk, 4096 // chunk)),
                               warps)
        assert len(cubin) > 0
        done += 1
    # the prefill index's merge of its splits' candidates (ids) by rank: 4 splits x 16
    cubin = compile_kernel(block_topk_select_kernel, dict(vals_ptr="*fp32", ids_ptr="*i32",
                                                          pos_ptr="*i32", out_ptr="*i32"),
                           dict(TOPK=16, TOPK_PAD=16, CHUNK=64, SPARSE_BLOCK=128,
                                HAS_IDS=True, VALID_FROM_POS=False, SINGLE_CHUNK=True,
                                RANK=True, RANK_COLS=64), 1)
    assert len(cubin) > 0
    print("compiled block_topk_select_kernel RANK HAS_IDS", flush=True)
    done += 1
    cubin = compile_kernel(sparse_attn_merge_kernel, dict(part_o_ptr="*fp32",
                                                          part_lse_ptr="*fp32", out_ptr="*bf16",
                                                          v_scale_ptr="*fp32"),
                           dict(HQ=16, S=8, S_PAD=8, D=128, D_PAD=128, PDL=True), 4)
    assert len(cubin) > 0
    # block-major's merge: fp16 partials, one warp, empty slots not read, a 1-D grid
    # in row order
    cubin = compile_kernel(sparse_attn_merge_kernel, dict(part_o_ptr="*fp16",
                                                          part_lse_ptr="*fp32", out_ptr="*bf16",
                                                          v_scale_ptr="*fp32"),
                           dict(HQ=16, S=16, S_PAD=16, D=128, D_PAD=128, SKIP_EMPTY=True,
                                ROW_ORDER=True), 1)
    assert len(cubin) > 0
    print("compiled block_topk_select_kernel and sparse_attn_merge_kernel PDL=True and "
          "SKIP_EMPTY=True ROW_ORDER=True", flush=True)
    done += 3
    # the two-launch decode of batch 1-2 over 64-block tables (score_attend_decode):
    # every scale mode with 4 key ranges per block, bf16 and fp8 index keys, one range;
    # PDL as the engine launches them at batch 1-2 on sm90; 4 warps (batch 1) and,
    # for every scale mode, 2 (batch 2)
    for mode, idx_keys, split, warps in (
            (0, "*bf16", 4, 4), (1, "*bf16", 4, 4), (2, "*bf16", 4, 4), (3, "*bf16", 4, 4),
            (0, "*fp8e4nv", 4, 4), (0, "*bf16", 1, 4),
            (0, "*bf16", 4, 2), (1, "*bf16", 4, 2), (2, "*bf16", 4, 2), (3, "*bf16", 4, 2)):
        ptrs = dict(idx_q_ptr="*bf16", idx_k_ptr=idx_keys, idx_ks_ptr="*fp32", q_ptr="*bf16",
                    kv_ptr="*bf16" if mode == 0 else "*fp8e4nv", bt_ptr="*i32",
                    req_ptr="*i32", pos_ptr="*i32", scores_ptr="*fp32", part_o_ptr="*fp16",
                    part_lse_ptr="*fp32", k_scale_ptr="*fp32", v_scale_ptr="*fp32",
                    kvs_ptr="*fp32")
        cubin = compile_kernel(score_attend_block_kernel, ptrs, dict(
            HQ=16, G=16, G_PAD=16, D=128, D_PAD=128, DI=128, DI_PAD=128, SPARSE_BLOCK=128,
            IDX_BLOCK_N=128 // split, KEY_SPLIT=split, BLOCK_N=128 // split, PAGE_SIZE=64,
            LOCAL=1, INIT=0, K_SCALED=idx_keys != "*bf16", SCALE_MODE=mode, IEEE=False,
            FP16_MMA=mode != 0, PDL=True), warps)
        assert len(cubin) > 0
        print(f"compiled score_attend_block_kernel mode {mode} index keys {idx_keys} "
              f"KEY_SPLIT={split} warps {warps} ({len(cubin)} B cubin)", flush=True)
        done += 1
    # its merge: one round of loads in 4 column chunks (batch 1), or after the ranks
    for one_round, dc in ((True, 32), (False, 128)):
        cubin = compile_kernel(score_attend_merge_kernel, dict(
            scores_ptr="*fp32", part_o_ptr="*fp16", part_lse_ptr="*fp32", pos_ptr="*i32",
            out_ptr="*bf16"), dict(HQ=16, G=16, TOPK=16, TOPK_PAD=16, NB_PAD=64, KEY_SPLIT=4,
                                   SPARSE_BLOCK=128, D=128, D_PAD=128, DC=dc,
                                   ONE_ROUND=one_round, PDL=True), 4)
        assert len(cubin) > 0
        print(f"compiled score_attend_merge_kernel ONE_ROUND={one_round} DC={dc} PDL=True "
              f"({len(cubin)} B cubin)", flush=True)
        done += 1
    print(f"ok {done} kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
