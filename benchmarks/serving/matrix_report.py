# SPDX-License-Identifier: Apache-2.0
"""The serving matrix's report: side JSONs (``side-<S>.json``, from one or several runs)
joined into ``matrix.md`` and ``matrix.json``.  Pure Python (no vLLM import), so the
files of separate device calls join on any machine:

  python -m benchmarks.serving.matrix report RUN1/side-A.json RUN1/side-B.json \\
      RUN2/side-C.json --out DIR

Rows of one side from several files join by (ISL, concurrency): a later file's row
replaces an earlier one unless the later row was not run.  Ratios are side / A per
row: output tok/s > 1 and TTFT / TPOT < 1 mean faster than A."""

import json
from pathlib import Path

SIDE_ORDER = ("A", "B", "C")
METRICS = (("output_throughput", "Output tokens/s", "{:.1f}", "> 1: faster than A"),
           ("median_ttft_ms", "Median TTFT (ms)", "{:.1f}", "< 1: faster than A"),
           ("median_tpot_ms", "Median TPOT (ms)", "{:.2f}", "< 1: faster than A"))


def merge(files: list[str]) -> dict:
    """``{side: {"runs": [per-file meta, env, servers, file], "rows": {name: row}}}``."""
    sides: dict = {}
    for f in files:
        state = json.loads(Path(f).read_text())
        side = sides.setdefault(state["side"], {"what": state.get("what", ""), "runs": [],
                                                "rows": {}})
        side["runs"].append({"file": str(f), "meta": state.get("meta", {}),
                             "env": state.get("env", {}), "servers": state.get("servers", [])})
        for name, row in state.get("rows", {}).items():
            key = f"{name} osl{row['osl']}"  # one row: ISL, OSL, concurrency
            old = side["rows"].get(key)
            if old is None or row.get("status") != "not run" or old.get("status") == "not run":
                side["rows"][key] = dict(row, name=name, file=str(f))
    return dict(sorted(sides.items(), key=lambda kv: (
        SIDE_ORDER.index(kv[0]) if kv[0] in SIDE_ORDER else 99, kv[0])))


def cell(row: dict | None, key: str, fmt: str) -> str:
    if row is None:
        return "-"
    if row.get("status") != "ok" or row.get(key) is None:
        return row.get("status", "-")
    return fmt.format(row[key])


def ratio(row: dict | None, base: dict | None, key: str) -> str:
    vals = [r.get(key) if r and r.get("status") == "ok" else None for r in (row, base)]
    return f"{vals[0] / vals[1]:.2f}" if vals[0] and vals[1] else "n/a"


def row_keys(sides: dict) -> list[tuple[int, int, int]]:
    """(ISL, OSL, concurrency) of every row of any side, sorted."""
    return sorted({(r["isl"], r["osl"], r["concurrency"]) for s in sides.values()
                   for r in s["rows"].values()})


def find(side: dict, isl: int, osl: int, conc: int) -> dict | None:
    return next((r for r in side["rows"].values()
                 if (r["isl"], r["osl"], r["concurrency"]) == (isl, osl, conc)), None)


def short(path: str) -> str:
    """The side file as its folder and name (calls differ by folder)."""
    p = Path(path)
    return f"{p.parent.name}/{p.name}" if p.parent.name else p.name


def starts(runs: list[dict]) -> str:
    """Every server start of the side, in order: seconds (why)."""
    out = []
    for run in runs:
        for s in run["servers"]:
            what = s.get("reason", "?")
            out.append(f"{s['start_s']} ({what})" if "start_s" in s
                       else f"failed ({what}): {str(s.get('error', '?'))[:80]}")
    return "; ".join(out) or "-"


def _counted(names: list[str]) -> str:
    """`a` x2, `b` (first-seen order) or none."""
    counts = {n: names.count(n) for n in dict.fromkeys(names)}
    return ", ".join(f"`{n}`" + (f" x{c}" if c > 1 else "") for n, c in counts.items()) or "none"


def jit_section(sides: dict) -> list[str]:
    """Which kernels compiled after start-up, per row (vLLM's JIT monitor, from
    the server log), and each side's series warm-up line; empty for side files
    written before these were recorded."""
    rows = [(n, r) for n, s in sides.items() for r in s["rows"].values() if "jit_in_run" in r]
    if not rows:
        return []
    lines = ["", "## Kernels compiled inside requests", "",
             "vLLM's JIT monitor in the server log: a kernel variant compiled after "
             "start-up, during the row's unrecorded warm-up (at concurrency 1: the "
             "first-request probe, where one ran) or during its recorded run. Every variant "
             "on A and B (`--jit-monitor-verbose`); on C (vLLM 0.23.0) the first compile of "
             "each kernel only. Rows not listed compiled nothing"
             + (" (side files from before 2026-12-08 carry no lists for C)." if any(
                 "jit_in_run" not in r for s in sides.values() for r in s["rows"].values()
                 if r.get("status") == "ok") else "."), ""]
    warm = [(n, srv["series_warmup"]) for n, s in sides.items() for run in s["runs"]
            for srv in run["servers"] if srv.get("series_warmup")]
    lines += [f"- {n} start-up: {w}" for n, w in warm]
    hits = [(n, r) for n, r in rows if r.get("jit_in_warmup") or r.get("jit_in_run")]
    if not hits:
        return lines + ["", "No row compiled a kernel."]
    lines += ["", "| side | row | in the row's warm-up | in the recorded run |", "|---|---|---|---|"]
    for n, r in hits:
        lines.append(f"| {n} | {r['isl']} / {r['osl']} x {r['concurrency']} | "
                     f"{_counted(r.get('jit_in_warmup', []))} | {_counted(r.get('jit_in_run', []))} |")
    return lines


def first_request_section(sides: dict) -> list[str]:
    """The first request at each prompt length against its repeats (first_request.py),
    per side; empty for side files without the probe."""
    rows = [(n, r) for n, s in sides.items() for r in s["rows"].values() if r.get("first_request")]
    if not rows:
        return []
    lines = ["", "## First request at a new prompt length", "",
             "Before each concurrency-1 row: one streamed request of the row's ISL, then "
             "repeats of the same length (fresh random tokens each), TTFT client-side; "
             "`fresh`: the server had not served that length before. Issue 48's criterion: "
             "first <= 1.2 x the repeats' median. JIT: what vLLM's monitor saw compile "
             "during these requests (C, vLLM 0.23.0: each kernel's first compile only; "
             "not monitored: C's side files from before 2026-12-08).", "",
             "| side | ISL | fresh | first TTFT, ms | repeats, ms | first / median | <= 1.2 | JIT |",
             "|---|---|---|---|---|---|---|---|"]
    for n, r in sorted(rows, key=lambda nr: (nr[1]["isl"], nr[0])):
        f = r["first_request"]
        head = f"| {n} | {r['isl']} | {'yes' if f.get('fresh') else 'no'} | "
        if "error" in f:
            lines.append(head + f"failed: {f['error'].replace('|', '/')[:200]} | - | - | - | - |")
            continue
        repeats = ", ".join(f"{t:.1f}" for t in f["repeat_ttft_ms"])
        lines.append(head + f"{f['first_ttft_ms']:.1f} | {repeats} | "
                     f"{f['first_over_repeat']:.2f} | {'yes' if f['within_limit'] else '**no**'} | "
                     + (f"{_counted(f['jit'])} |" if "jit" in f else "not monitored |"))
    warm = [(n, r["first_request"]) for n, r in rows
            if "server_first_ttft_ms" in r["first_request"]]
    if warm:
        lines += ["", "The server's first request, before the first probe (its costs belong to no "
                  "prompt length: the front end's first request): "
                  + "; ".join(f"{n}: {f['server_first_ttft_ms']:.1f} ms TTFT for "
                              f"{f['server_warm_isl']} tokens" for n, f in warm) + "."]
    if any("client" not in r["first_request"] for _, r in rows):
        lines += ["", "Probes without a `client` field (older side files) timed the OpenAI "
                  "client's request building and its first connection inside each TTFT "
                  "(about 0.3 s at 32k ids, tens of ms on its first call, on a 2-core CPU)."]
    return lines


def render(sides: dict) -> str:
    if not sides:
        return "# MiniMax-M3 serving matrix\n\nNo side files given.\n"
    names = list(sides)
    others = [s for s in names if s != "A"] if "A" in names else []
    first = next(iter(sides.values()))["runs"][0]["meta"]
    smoke = first.get("mode") == "smoke-cpu"
    osls = sorted({r["osl"] for s in sides.values() for r in s["rows"].values()})
    lines = ["# MiniMax-M3 serving matrix: " + " / ".join(names) + (" (CPU smoke)" if smoke else ""),
             "",
             f"A = v0.26.0 wheel with VLLM_MINIMAX_M3_MSA=upstream (vLLM's MSA kernels); "
             f"B = the same install with =series (the series' kernels); C = v0.23.0 wheel "
             f"with the series.  One config-only model (released layer shapes, "
             f"{first.get('layers', '?')} layers: 1 dense + MSA/MoE, dummy weights: "
             f"{first.get('model', '?')}), `vllm serve` with FP8 KV, FULL_AND_PIECEWISE, "
             f"chunked prefill, prefix caching off, block 128, max-model-len "
             f"{first.get('max_model_len', '?')}; `vllm bench serve` random dataset, OSL "
             f"{'/'.join(map(str, osls))}, greedy, ignore_eos; warm-up before each row: "
             f"{first.get('warmup', '?')} (unrecorded)."
             + (" CPU smoke: tiny shapes, fp32, eager, KV auto: the harness only, no "
                "performance meaning." if smoke else ""), "",
             "## Sides", "",
             "| side | what | date (UTC) | GPU | vllm | torch | repo commit | bench | "
             "server starts, s (why) | MSA path in log | file |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, side in sides.items():
        for run in side["runs"]:
            m = run["meta"]
            msa = sorted({s.get("msa_path_in_log") for s in run["servers"]} - {None})
            lines.append(f"| {name} | {side['what']} | {m.get('date', '?')} | {m.get('gpu', '?')} | "
                         f"{m.get('vllm', '?')} | {m.get('torch', '?')} | {m.get('commit', '?')} | "
                         f"{m.get('bench_mode', '?')} | {starts([run])} | "
                         f"{', '.join(msa) or '-'} | {short(run['file'])} |")
    notes = sorted({s["compile_note"] for side in sides.values() for run in side["runs"]
                    for s in run["servers"] if s.get("compile_note")})
    lines += ["", "Start-up: seconds from `vllm serve` to a healthy /health (dummy weights, "
              "compile and graph capture included); a side that starts after another in the "
              "same call may find compile caches warm."]
    if notes:
        lines += ["", "Server log notes: " + "; ".join(
            f"{n} on " + ", ".join(k for k, s in sides.items() if any(
                v.get("compile_note") == n for r in s["runs"] for v in r["servers"]))
            for n in notes) + "."]
    if len({json.dumps(run["meta"].get("mode")) for s in sides.values() for run in s["runs"]}) > 1:
        lines += ["", "**Warning:** the files mix GPU runs and CPU smoke runs."]
    for key, title, fmt, sense in METRICS:
        lines += ["", f"## {title}", "",
                  "| ISL / OSL | concurrency | prompts | " + " | ".join(names)
                  + "".join(f" | {o}/A ({sense})" for o in others) + " |",
                  "|---" * (3 + len(names) + len(others)) + "|"]
        for isl, osl, conc in row_keys(sides):
            rows = {n: find(s, isl, osl, conc) for n, s in sides.items()}
            nps = sorted({r["num_prompts"] for r in rows.values() if r})
            prompts = (str(nps[0]) if len(nps) == 1 else
                       " / ".join(f"{n} {r['num_prompts']}" for n, r in rows.items() if r))
            lines.append(f"| {isl} / {osl} | {conc} | {prompts} | "
                         + " | ".join(cell(rows[n], key, fmt) for n in names)
                         + "".join(f" | {ratio(rows[o], rows.get('A'), key)}" for o in others)
                         + " |")
    lines += first_request_section(sides)
    lines += jit_section(sides)
    bad = [(n, f"{r['name']} (OSL {r['osl']})" if len(osls) > 1 else r["name"], r)
           for n, s in sides.items() for r in s["rows"].values() if r.get("status") != "ok"]
    if bad:
        lines += ["", "## Rows without numbers", "", "| side | row | status | why |",
                  "|---|---|---|---|"]
        for n, name, r in bad:
            why = r.get("reason", "")
            if r.get("error_line"):
                why += f": `{r['error_line']}`"
            lines.append(f"| {n} | {name} | {r['status']} | {why.replace('|', '/')[:400]} |")
    logs = [(n, name, r) for n, name, r in bad if r.get("log_tail")]
    logs += [(n, f"server start ({s.get('reason', '?')})", dict(s, reason=s.get("error", "")))
             for n, side in sides.items() for run in side["runs"] for s in run["servers"]
             if s.get("log_tail")]
    if logs:
        lines += ["", "## Server logs of crashed rows and failed starts",
                  "", "From the first error on where the log has one, else its last lines."]
        for n, name, r in logs:
            text = ("\n".join(r["log_excerpt"].splitlines()[:40]) if r.get("log_excerpt")
                    else "\n".join(r["log_tail"].splitlines()[-40:]))
            lines += ["", f"### {n} {name}: {r.get('reason', '')}", "", "```text", text, "```"]
    cmd = next((r["cmd"] for s in sides.values() for r in s["rows"].values() if r.get("cmd")), None)
    if cmd:
        lines += ["", f"Example bench command: `{cmd}`"]
    flags = next((srv["flags"] for s in sides.values() for run in s["runs"]
                  for srv in run["servers"] if srv.get("flags")), None)
    if flags:
        lines += ["", f"Server flags: `vllm serve <model-dir> {flags}`; environment per side: "
                  + "; ".join(f"{n}: `{' '.join(f'{k}={v}' for k, v in s['runs'][0]['env'].items())}`"
                              for n, s in sides.items())]
    return "\n".join(lines) + "\n"


def write_report(files: list[str], out: Path) -> Path:
    """``out/matrix.md`` and ``out/matrix.json`` (the joined sides); returns the .md path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sides = merge(files)
    (out / "matrix.json").write_text(json.dumps(sides, indent=1, default=str))
    (out / "matrix.md").write_text(render(sides))
    return out / "matrix.md"
