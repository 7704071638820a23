# SPDX-License-Identifier: Apache-2.0
"""The markdown report of a benchmark run (``bench_msa.md``) and its metadata."""

import os
import subprocess


from .harness import REPO


def _git_commit():
    if os.environ.get("GIT_COMMIT"):  # the caller knows the commit (device copies may lack .git)
        return os.environ["GIT_COMMIT"]
    try:
        return subprocess.check_output(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                       stderr=subprocess.DEVNULL, text=True).strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def _f(x, nd=1):
    return "-" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def to_markdown(res):
    i = res["info"]
    L = [f"# MiniMax-M3 MSA Triton kernels: benchmark",
         "",
         f"date {i['date']}, GPU {i['gpu']}, commit {i['commit']}, torch {i['torch']}, "
         f"triton {i['triton']}; shapes: {i['shapes']}.",
         f"Timing: {i['timing']}. Copy bandwidth (this run): "
         f"{res.get('copy_bandwidth_GBps', 0):.0f} GB/s.",
         "",
         f"Correctness at real shapes: **{'PASS' if res.get('correctness_passed') else 'FAIL'}**",
         ""]
    lf = res.get("launch_floor_us")
    if lf:
        L += ["Launch floor (graph of n one-program kernels, each a chain of 3 dependent "
              "loads; us, flushed / warm): "
              + ", ".join(f"{n} kernels {_f(lf.get(f'{n}_kernels'))} / "
                          f"{_f(lf.get(f'{n}_kernels_warm'))}" for n in (1, 2, 4)) + ".", ""]
    for e in res.get("correctness", []):
        L.append(f"- {e['case']}: {'pass' if e['passed'] else 'FAIL'}"
                 + (f" (top-k valid {e.get('topk_valid_fraction')}, attn max err "
                    f"{_f(e.get('attn_max_abs_err'), 4)}"
                    + (f", fp8-index valid {e.get('fp8_index_valid_fraction')}, overlap with bf16 "
                       f"{_f(e.get('fp8_index_overlap_with_bf16'), 3)}"
                       if 'fp8_index_valid_fraction' in e else "") + ")"
                    if 'error' not in e else " (exception, see JSON)"))
    L += ["", "KV: bf16; fp8 = e4m3 with scalar per-layer scales; fp8-pth = e4m3 with "
          "per-token-head scales (their bytes are in the floor).",
          "", "## Decode (microseconds)", "",
          "total = the engine's path: `chain` (index+top-k then attention: four "
          "launches) or `score_attend` (batch 1-2 over at most 64 blocks: every visible "
          "block scored and attended, the top-k merged; two launches); total chain = the "
          "four launches.", "",
          "| batch | context | KV | index+top-k | attention | total | path | total chain "
          "| floor | total/floor | dense "
          "| index+top-k fp8-idx | total fp8-idx | floor fp8-idx | fp8-idx overlap "
          "| index+top-k fused select | attention fused merge | total fused "
          "| attention fp8 unfolded | index+top-k PDL | attention PDL | total PDL "
          "| total PDL / floor |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res.get("decode", []):
        ratio = (r["total_us"] / r["floor_us"]) if "total_us" in r and "floor_us" in r else None
        L.append(f"| {r['batch']} | {r['context'] // 1024}k | {r['kv']} | "
                 f"{_f(r.get('index_topk_us'))} | {_f(r.get('attention_us'))} | "
                 f"{_f(r.get('total_us'))}"
                 f"{'' if r.get('score_attend_max_diff', 0.0) < 1e-2 else ' (output DIFFERS)'} | "
                 f"{r.get('path', 'chain')} | {_f(r.get('total_chain_us'))} | "
                 f"{_f(r.get('floor_us'))} | {_f(ratio, 2)} | "
                 f"{_f(r.get('dense_us'))} | {_f(r.get('index_topk_fp8idx_us'))} | "
                 f"{_f(r.get('total_fp8idx_us'))} | "
                 f"{_f(r.get('floor_fp8idx_us'))} | {_f(r.get('fp8idx_topk_overlap'), 3)} | "
                 f"{_f(r.get('index_topk_fused_us'))}"
                 f"{'' if r.get('fused_select_equal', True) else ' (ids DIFFER)'} | "
                 f"{_f(r.get('attention_fused_us'))}"
                 f"{'' if r.get('fused_merge_max_diff', 0.0) < 1e-2 else ' (output DIFFERS)'} | "
                 f"{_f(r.get('total_fused_us'))} | {_f(r.get('attention_unfolded_us'))} | "
                 f"{_f(r.get('index_topk_pdl_us'))}"
                 f"{'' if r.get('pdl_select_equal', True) else ' (ids DIFFER)'} | "
                 f"{_f(r.get('attention_pdl_us'))}"
                 f"{'' if r.get('pdl_max_diff', 0.0) < 1e-2 else ' (output DIFFERS)'} | "
                 f"{_f(r.get('total_pdl_us'))} | "
                 f"{_f(r['total_pdl_us'] / r['floor_us'] if 'total_pdl_us' in r and 'floor_us' in r else None, 2)} |"
                 + (" ERROR |" if "error" in r else ""))
    fp = res.get("flush_probe")
    if fp:
        L += ["", "## What the L2 flush costs a read-only kernel (microseconds)", "",
              f"One read of a buffer (Triton, 16-byte loads); L2 {fp['l2_bytes'] >> 20} MiB. "
              "Write flush = 256 MiB zeroed before the replay (dirty L2), read flush = "
              "256 MiB read (clean L2).", "",
              "| buffer | floor | write flush | read flush | warm | write - read "
              "| read flush, 16 KiB per program |",
              "|---|---|---|---|---|---|---|"]
        for k, v in fp.items():
            if isinstance(v, dict):
                L.append(f"| {k} | {_f(v['floor_us'])} | {_f(v['write_flush_us'])} | "
                         f"{_f(v['read_flush_us'])} | {_f(v['warm_us'])} | "
                         f"{_f(v['write_flush_us'] - v['read_flush_us'])} | "
                         f"{_f(v.get('read_flush_16k_us'))} |")
    if any("total_clean_us" in r for r in res.get("decode", [])):
        L += ["", "## Decode with a clean L2 (flushed by a 256 MiB read; microseconds)", "",
              "| batch | context | KV | index+top-k | attention | total | path | total chain "
              "| total PDL | floor | total/floor | PDL/floor | index+top-k fp8-idx |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in res.get("decode", []):
            fl = r.get("floor_us")
            tc, tp = r.get("total_clean_us"), r.get("total_pdl_clean_us")
            L.append(f"| {r['batch']} | {r['context'] // 1024}k | {r['kv']} | "
                     f"{_f(r.get('index_topk_clean_us'))} | {_f(r.get('attention_clean_us'))} | "
                     f"{_f(tc)} | {r.get('path', 'chain')} | {_f(r.get('total_chain_clean_us'))} | "
                     f"{_f(tp)} | {_f(fl)} | "
                     f"{_f(tc / fl if tc and fl else None, 2)} | "
                     f"{_f(tp / fl if tp and fl else None, 2)} | "
                     f"{_f(r.get('index_topk_fp8idx_clean_us'))} |")
    L += ["", "## Prefill: token-tiled attention (milliseconds; distinct blocks per 4-token "
          "tile, at most 4 x top-k)", "",
          "| context | KV | selection | distinct blocks / 4 tokens | attention | tiled 4 | tiled 8 |",
          "|---|---|---|---|---|---|---|"]
    for r in res.get("prefill", []):
        if "attention_corr_ms" not in r:
            continue
        L.append(f"| {r['context'] // 1024}k | {r['kv']} | random | "
                 f"{_f(r.get('tile4_distinct_blocks'))} | "
                 f"{_f(r.get('attention_per_token_ms', r.get('attention_ms')), 3)} | "
                 f"{_f(r.get('attention_tiled4_ms'), 3)} | {_f(r.get('attention_tiled8_ms'), 3)} |")
        L.append(f"| {r['context'] // 1024}k | {r['kv']} | prefill-like | "
                 f"{_f(r.get('corr_tile4_distinct_blocks'))} | "
                 f"{_f(r.get('attention_corr_ms'), 3)} | "
                 f"{_f(r.get('attention_corr_tiled4_ms'), 3)} | "
                 f"{_f(r.get('attention_corr_tiled8_ms'), 3)} |")
    L += ["", "## Prefill, chunk of 8192 at the end of the context (milliseconds)", "",
          "attention = the engine's launch (layout: BM4 = block-major, 4 pairs per step, "
          "for chunks of at least 1024 tokens; else TM = token tile by the context-length rule, "
          "TM0 = one token per program); dense = SDPA with a lower-right causal mask; "
          "dense FA2 = SDPA `is_causal` forced onto its flash (FlashAttention-2) backend (chunk = context only; the default backend choice is faster).", "",
          "| context | KV | index+top-k | layout | attention | total | dense | dense FA2 "
          "| attention per token | attention TFLOP/s "
          "| attention fp8 unfolded | attention tiled 2 | attention tiled 4 | attention tiled 8 "
          "| attention block-major 4 | attention block-major 8 |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res.get("prefill", []):
        L.append(f"| {r['context'] // 1024}k | {r['kv']} | {_f(r.get('index_topk_ms'), 3)} | "
                 f"{_layout_name(r)} | "
                 f"{_f(r.get('attention_ms'), 3)} | {_f(r.get('total_ms'), 3)} | "
                 f"{_f(r.get('dense_ms'), 3)} | {_f(r.get('dense_flash_ms'), 3)} | "
                 f"{_f(r.get('attention_per_token_ms'), 3)} | "
                 f"{_f(r.get('attention_TFLOPs'), 0)} | "
                 f"{_f(r.get('attention_unfolded_ms'), 3)} | "
                 + " | ".join(_f(r.get(f"attention_tiled{tm}_ms"), 3)
                              + ("" if r.get(f"tiled{tm}_max_diff", 0.0) < 2e-2 else " (DIFFERS)")
                              for tm in (2, 4, 8)) + " | "
                 + " | ".join(_f(r.get(f"attention_block_major{bm}_ms"), 3)
                              + ("" if r.get(f"block_major{bm}_max_diff", 0.0) < 2e-2
                                 else " (DIFFERS)")
                              for bm in (4, 8)) + " |"
                 + (" ERROR |" if "error" in r else ""))
    return "\n".join(L) + "\n"


def _layout_name(row):
    lay = row.get("layout") or dict(token_tile=row.get("token_tile_rule", 0))
    if lay.get("block_major"):
        return f"BM{lay['block_major']}"
    return f"TM{lay.get('token_tile', 0)}"

