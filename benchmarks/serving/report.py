# SPDX-License-Identifier: Apache-2.0
"""The dated report (``e2e.md``) and ``e2e.json``, rewritten after every job."""

import json
import time

from . import server
from .server import FOLD_ENV, Plan


def section_status(state: dict, sec: str) -> str:
    res = state["results"].get(sec)
    if not res:
        return "not run"
    bad_stop = not all(s.get("clean_stop") for s in state["servers"] if "stop_rc" in s)
    if any(not r.get("ok") and "skipped" not in r for r in res.values()) or (
            sec == "serve" and bad_stop):
        return "FAIL"
    if any("skipped" in r for r in res.values()):
        return "incomplete (deadline)"
    return "pass"


def fmt(v, unit: str = "") -> str:
    return "-" if v is None else f"{v}{unit}"


def md_serve(res: dict, state: dict) -> list[str]:
    lines = ["| prompt len | prompt tokens | completion tokens | latency (s) | text non-empty "
             "| logprobs finite | distinct tokens | ok |", "|---|---|---|---|---|---|---|---|"]
    for job in res.values():
        for r in job.get("rows", []):
            lines.append(f"| {r['prompt_len']} | {fmt(r.get('prompt_tokens'))} | "
                         f"{fmt(r.get('completion_tokens'))} | {fmt(r.get('latency_s'))} | "
                         f"{fmt(r.get('text_nonempty'))} | {fmt(r.get('logprobs_finite'))} | "
                         f"{fmt(r.get('distinct_tokens'))} | {r['ok']} {r.get('error', '')} |")
        if job.get("chat"):
            lines += ["", f"chat completion: `{json.dumps(job['chat'])}`"]
        if job.get("error") or job.get("skipped"):
            lines += ["", f"error: `{(job.get('error') or job['skipped'])[:500]}`"]
    stops = [s for s in state["servers"] if "stop_rc" in s]
    lines += ["", f"server stops (SIGINT, <= 60 s, rc 0 or SIGINT): "
              f"{sum(bool(s.get('clean_stop')) for s in stops)} of {len(stops)} clean"]
    return lines


def md_concurrency(res: dict, state: dict) -> list[str]:
    lines = []
    for name, r in res.items():
        if "requests" not in r:
            lines.append(f"{name}: `{r.get('error', r.get('skipped'))}`")
            continue
        lines += [f"{name}: {r['exact_matches']} of {r['requests']} concurrent outputs equal "
                  f"the alone outputs (prompts {r['prompt_lens']} tokens, {r['max_tokens']} "
                  f"greedy tokens, {r.get('distinct_tokens')} distinct token ids in all "
                  f"outputs); errors {r['n_errors']}; runs with non-finite logprobs "
                  f"{r['nonfinite_logprob_runs']}; largest |logprob difference| of a chosen "
                  f"token before any divergence {r['max_logprob_diff_equal_prefix']:.3g}; "
                  f"wall {r['concurrent_wall_s']} s together, "
                  f"{r['sequential_wall_s']} s one by one."]
        if r["mismatches"]:
            lines += ["", "| request | prompt len | first divergence | alone top1-top2 logprob "
                      "| max logprob diff before |", "|---|---|---|---|---|"]
            lines += [f"| {m['request']} | {m['prompt_len']} | {m['first_divergence']} | "
                      f"{fmt(m['alone_top1_minus_top2'])} | {fmt(m['max_logprob_diff_before'])} |"
                      for m in r["mismatches"][:20]]
        lines += [f"error: `{e}`" for e in r["errors"]]
    return lines


def md_throughput(res: dict, state: dict, plan: Plan) -> list[str]:
    b, lens = plan.tp_batches, plan.tp_ttft_lens
    head = ("| mode | " + " | ".join(f"decode tok/s b{x} | ms/token b{x}" for x in b) + " | "
            + " | ".join(f"TTFT ms {n} (engine prefill ms)" for n in lens) + " | ok |")
    lines = [f"{plan.tp_prompt}-token prompts, {plan.tp_out} output tokens (ignore_eos), "
             "greedy; decode numbers from the engine's timestamps (/metrics: first to last "
             f"token); TTFT client-side, median of {plan.tp_repeats}.", "",
             head, "|---" * (2 + 2 * len(b) + len(lens)) + "|"]
    for name, r in res.items():
        cells = [f"{fmt(r.get(f'decode_tok_s_b{x}'))} | {fmt(r.get(f'ms_per_token_b{x}'))}"
                 for x in b]
        cells += [f"{fmt(r.get(f'ttft_ms_{n}'))} ({fmt(r.get(f'prefill_ms_{n}'))})" for n in lens]
        err = " ".join(str(v)[:200] for k, v in r.items() if k.startswith(("error", "skipped")))
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {r.get('ok')} {err} |")
    if plan.smoke:
        lines += ["", "(smoke on CPU: every mode runs eager with KV auto)"]
    return lines


def md_bench_ab(res: dict, state: dict, plan: Plan) -> list[str]:
    lines = [f"`vllm bench serve` random dataset, OSL {plan.ab_osl}, num-prompts = "
             f"{plan.ab_prompts_per_conc} x concurrency, greedy, ignore_eos, KV {plan.main_kv}; "
             f"fold = {FOLD_ENV}=1 (default), unfolded = {FOLD_ENV}=0.", "",
             "| ISL/OSL | concurrency | prompts | metric | unfolded (0) | fold (1) | change |",
             "|---|---|---|---|---|---|---|"]
    if state["meta"].get("merged_from"):
        lines[0] += (" The two folds were served side by side, each on its own GPU of the "
                     "same machine (`--ab-folds 1` / `--ab-folds 0`, joined by `--merge-ab`).")
    runs = {(r["isl"], r["concurrency"], r["fold"]): r for r in res.values() if "isl" in r}
    for isl, c in sorted({k[:2] for k in runs}):
        off, on = runs.get((isl, c, False), {}), runs.get((isl, c, True), {})
        n = on.get("num_prompts", off.get("num_prompts"))
        for key, label in (("output_throughput", "output tok/s"),
                           ("median_ttft_ms", "TTFT median (ms)"),
                           ("median_tpot_ms", "TPOT median (ms)")):
            a, b = off.get(key), on.get(key)
            chg = f"{100 * (b - a) / a:+.1f}%" if a and b else "-"
            lines.append(f"| {isl}/{plan.ab_osl} | {c} | {n} | {label} | "
                         f"{fmt(a and round(a, 2))} | {fmt(b and round(b, 2))} | {chg} |")
    bad = {n: r.get("error") or r.get("skipped") for n, r in res.items() if not r.get("ok")}
    lines += [f"- {n}: `{str(e)[:300]}`" for n, e in bad.items()]
    cmd = next((r["cmd"] for r in res.values() if "cmd" in r), None)
    if cmd:
        lines += ["", f"example command: `{cmd}`"]
    return lines


def write_report(plan: Plan, state: dict) -> None:
    """$OUT/e2e.json (everything) and $OUT/e2e.md (dated summary + tables)."""
    state["wall_s"] = round(time.monotonic() - server.T0, 1)
    (plan.out / "e2e.json").write_text(json.dumps(state, indent=1, default=str))
    m, pre = state["meta"], state["meta"].get("preflight", {})
    lines = ["# MiniMax-M3 end-to-end serving validation" + (" (CPU smoke)" if plan.smoke else ""),
             "", f"date: {m['date']} | GPU: {pre.get('gpu', '?')} | vllm: {pre.get('vllm', '?')} | "
             f"torch: {pre.get('torch', '?')} | repo commit: {m['git_commit']} | "
             f"wall: {state['wall_s']} s", "",
             f"model: {m['model']} (random weights, --load-format dummy)", "",
             f"server deps: `{json.dumps(m.get('deps'))}`", "",
             "| section | status | wall (s) |", "|---|---|---|"]
    for sec in state["sections"]:
        wall = sum(r.get("job_s", 0) for r in state["results"].get(sec, {}).values())
        lines.append(f"| {sec} | {section_status(state, sec)} | {wall:.0f} |")
    render = {"serve": md_serve, "concurrency": md_concurrency,
              "throughput": lambda r, s: md_throughput(r, s, plan),
              "bench_ab": lambda r, s: md_bench_ab(r, s, plan)}
    for sec in state["sections"]:
        if state["results"].get(sec):
            lines += ["", f"## {sec}", ""] + render[sec](state["results"][sec], state)
    lines += ["", "## servers", "", "| config | env | start (s) | warm-up (s) | stop rc | stop (s) "
              "| clean stop | error |", "|---|---|---|---|---|---|---|---|"]
    for s in state["servers"]:
        lines.append(f"| {s['config']} | {s['env']} | {fmt(s.get('start_s'))} | "
                     f"{fmt(s.get('warmup_s'))} | "
                     f"{fmt(s.get('stop_rc'))} | {fmt(s.get('stop_s'))} | "
                     f"{fmt(s.get('clean_stop'))} | {str(s.get('error', ''))[:200]} |")
    if state["servers"]:
        lines += ["", f"flags (first server): `{state['servers'][0]['flags']}`"]
    (plan.out / "e2e.md").write_text("\n".join(lines) + "\n")

