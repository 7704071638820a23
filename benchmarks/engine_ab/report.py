# SPDX-License-Identifier: Apache-2.0
"""engine_ab.json -> a markdown table: each row for A and B, and B against A."""


def write_report(meta: dict, path: str) -> None:
    sides = meta["sides"]
    others = [s for s in ("B", "C") if s in sides] if "A" in sides else []
    names = []
    for s in sides.values():
        names += [n for n in s["rows"] if n not in names]
    lines = [f"# MiniMax-M3 engine A/B, v0.26.0 flavor ({meta['date']})", "",
             f"Config-only model: {meta['layers']} layers (1 dense, the rest MSA + MoE), "
             f"dummy weights{', smoke shapes on CPU' if meta['smoke'] else ', released shapes'}.",
             "A = v0.26.0 flavor with VLLM_MINIMAX_M3_MSA=upstream, B = the same install with "
             "VLLM_MINIMAX_M3_MSA=series, C = the v0.23.0 flavor (its own install); "
             "X vs A > 1 means X is faster.", "",
             "| row | " + " | ".join(sides) + "".join(f" | {o} vs A" for o in others) + " |",
             "|---|" + "---|" * (len(sides) + len(others))]
    for n in names:
        vals = [sides[s]["rows"].get(n) for s in sides]
        a = sides.get("A", {}).get("rows", {}).get(n)
        ratios = []
        for o in others:
            b = sides[o]["rows"].get(n)
            ratios.append(f"{a / b:.2f}x" if a and b else "n/a")
        lines.append(f"| {n} | " + " | ".join("-" if v is None else str(v) for v in vals)
                     + "".join(f" | {r}" for r in ratios) + " |")
    lines.append("")
    lines += prefill_wall_lines(sides)
    lines += profile_lines(sides)
    for s, d in sides.items():
        if d["rc"] not in (0, "not run"):
            lines.append(f"Side {s} ended with rc={d['rc']} (see side-{s}.log); rows after "
                         "the last one shown were not measured.")
    open(path, "w").write("\n".join(lines) + "\n")


def prefill_wall_lines(sides: dict) -> list[str]:
    """One row per prefill profile (mode and length): each side's median wall time of
    the unprofiled prefills, and each other side against A (> 1: faster than A)."""
    keys = []
    for d in sides.values():
        keys += [k for k, prof in (d.get("profiles") or {}).items()
                 if k.startswith("prefill") and "wall_median_ms" in prof and k not in keys]
    if not keys:
        return []
    others = [s for s in sides if s != "A"] if "A" in sides else []

    def profile(side, key) -> dict:
        return (sides[side].get("profiles") or {}).get(key, {})

    def wall(side, key):
        return profile(side, key).get("wall_median_ms")

    def first(side, key):
        prof = profile(side, key)
        return (f"{prof['first_wall_ms'] / prof['wall_median_ms']:.2f}"
                if prof.get("first_wall_ms") and prof.get("wall_median_ms") else "-")

    out = ["## Prefill wall time without the profiler (median of the unprofiled repeats)", "",
           "X vs A > 1: X is faster. First / repeat: the first prefill at that length in the "
           "engine against the median (issue 48: at most 1.2).", "",
           "| prefill | " + " | ".join(f"{s}, ms" for s in sides)
           + "".join(f" | {o} vs A" for o in others)
           + "".join(f" | {s} first / repeat" for s in sides) + " |",
           "|---|" + "---|" * (2 * len(sides) + len(others))]
    for k in keys:
        cells = [wall(s, k) for s in sides]
        ratios = [f"{wall('A', k) / wall(o, k):.2f}x" if wall("A", k) and wall(o, k) else "n/a"
                  for o in others]
        out.append(f"| {k} | " + " | ".join("-" if c is None else str(c) for c in cells)
                   + "".join(f" | {r}" for r in ratios)
                   + "".join(f" | {first(s, k)}" for s in sides) + " |")
    return out + [""]


def profile_lines(sides: dict) -> list[str]:
    """Per side and mode: the decode step (or the prefill) split into kernel families
    and host time, then the top kernels (step_profile's JSON)."""
    out = []
    for s, d in sides.items():
        for mode, prof in (d.get("profiles") or {}).items():
            prefill = mode.startswith("prefill")
            head = f"## {'Prefill' if prefill else 'Decode step'} profile, side {s}, {mode}"
            if "step_ms" not in prof:
                out += [head, "", f"Not measured (rc={prof.get('rc')}; see the profile log).", ""]
                continue
            what = (f"One {prof['ctx']}-token prompt" if prefill
                    else f"Batch {prof['batch']} over {prof['ctx']}-token contexts")
            count = "the whole prefill" if prefill else f"{prof['steps']} steps"
            unprofiled = (f" Without the profiler: median {prof['wall_median_ms']} ms over "
                          f"{len(prof.get('wall_ms_samples', []))} fresh prompts."
                          if "wall_median_ms" in prof else "")
            out += [head, "",
                    f"{what} on {prof['device']}: "
                    f"step {prof['step_ms']} ms = kernels {prof['kernel_ms_per_step']} ms + host "
                    f"{prof['host_ms_per_step']} ms ({count}, profiled).{unprofiled}", "",
                    "| kernel family | us per step |", "|---|---|"]
            out += [f"| {k} | {v} |" for k, v in prof["families_us_per_step"].items()]
            out += ["", "| kernel (top 12) | us per step |", "|---|---|"]
            out += [f"| `{k[:90]}` | {v} |"
                    for k, v in list(prof["kernels_us_per_step"].items())[:12]]
            if prof.get("layers_ms"):
                out += ["", "| layer (eager) | ms |", "|---|---|"]
                out += [f"| {k} | {v} |" for k, v in prof["layers_ms"].items()]
            out.append("")
    return out
