# SPDX-License-Identifier: Apache-2.0
"""The launch-shape sweeps (``--sweep`` / ``--sweep-kinds``): kinds and dispatch."""

from .floors import sweep_l2, sweep_latency_floor, sweep_read_ceiling
from .harness import load_kernels
from .sweeps_decode import (sweep_decode, sweep_decode_attn_warps, sweep_decode_profile,
                            sweep_decode_variants, sweep_kv_dtype_parity, sweep_pdl,
                            sweep_pdl_fused, sweep_prefill_attn_profile)
from .sweeps_prefill import (sweep_block_major, sweep_fp8_index, sweep_index_tiles,
                             sweep_prefill_attn, sweep_prefill_index, sweep_prefill_index_shapes,
                             sweep_prefill_index_split, sweep_prefill_index_wide,
                             sweep_prefill_tiles)


SWEEP_KINDS = ("decode", "prefill_index", "prefill_tiles", "prefill_attn", "fp8_index",
               "prefill_index_shapes", "pdl", "l2", "prefill_index_wide", "pdl_fused",
               "block_major", "decode_profile", "decode_variants", "decode_attn_warps",
               "prefill_attn_profile", "index_tiles", "read_ceiling", "kv_dtype_parity",
               "latency_floor", "prefill_index_split")


def sweep(timer, dev, kinds=SWEEP_KINDS):
    """Tuning sweep of the launch-shape knobs (not part of the table); ``kinds``
    picks the sweeps and their order (decode index + attention, prefill index,
    prefill attention, decode index over the fp8 index-key cache)."""
    index_block_topk, block_sparse_attention, _ = load_kernels()
    runners = dict(decode=sweep_decode, prefill_index=sweep_prefill_index,
                   prefill_tiles=sweep_prefill_tiles, prefill_attn=sweep_prefill_attn,
                   fp8_index=sweep_fp8_index, prefill_index_shapes=sweep_prefill_index_shapes,
                   pdl=sweep_pdl, l2=sweep_l2, prefill_index_wide=sweep_prefill_index_wide,
                   pdl_fused=sweep_pdl_fused, block_major=sweep_block_major,
                   decode_profile=sweep_decode_profile, decode_variants=sweep_decode_variants,
                   decode_attn_warps=sweep_decode_attn_warps,
                   prefill_attn_profile=sweep_prefill_attn_profile,
                   index_tiles=sweep_index_tiles, read_ceiling=sweep_read_ceiling,
                   kv_dtype_parity=sweep_kv_dtype_parity, latency_floor=sweep_latency_floor,
                   prefill_index_split=sweep_prefill_index_split)
    out = []
    for kind in kinds:
        out += runners[kind](timer, dev, index_block_topk, block_sparse_attention)
    return out

