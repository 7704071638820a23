# SPDX-License-Identifier: Apache-2.0
"""engine_ab.json -> a markdown table: each row for A and B, and B against A."""


def write_report(meta: dict, path: str) -> None:
    sides = meta["sides"]
    names = []
    for s in sides.values():
        names += [n for n in s["rows"] if n not in names]
    lines = [f"# MiniMax-M3 engine A/B, v0.26.0 flavor ({meta['date']})", "",
             f"Config-only model: {meta['layers']} layers (1 dense, the rest MSA + MoE), "
             f"dummy weights{', smoke shapes on CPU' if meta['smoke'] else ', released shapes'}.",
             "A = VLLM_MINIMAX_M3_MSA=upstream, B = VLLM_MINIMAX_M3_MSA=series; "
             "B vs A > 1 means B is faster.", "",
             "| row | " + " | ".join(sides) + " | B vs A |",
             "|---|" + "---|" * len(sides) + "---|"]
    for n in names:
        vals = [sides[s]["rows"].get(n) for s in sides]
        a, b = sides.get("A", {}).get("rows", {}).get(n), sides.get("B", {}).get("rows", {}).get(n)
        ratio = f"{a / b:.2f}x" if a and b else "n/a"
        lines.append(f"| {n} | " + " | ".join("-" if v is None else str(v) for v in vals)
                     + f" | {ratio} |")
    lines.append("")
    for s, d in sides.items():
        if d["rc"] != 0:
            lines.append(f"Side {s} ended with rc={d['rc']} (see side-{s}.log); rows after "
                         "the last one shown were not measured.")
    open(path, "w").write("\n".join(lines) + "\n")
