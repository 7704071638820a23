# SPDX-License-Identifier: Apache-2.0
"""The serving matrix on CPU without vLLM: its row plan and sizes, the report that joins
side JSONs from separate runs (fake inputs), the install check, and the bench worker's
protocol (a fake CLI entry point in place of vLLM's)."""

import json
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.serving import matrix  # noqa: E402
from benchmarks.serving.bench_serve import BenchWorker, bench_args, warmup_args  # noqa: E402
from benchmarks.serving.matrix_report import merge, render, write_report  # noqa: E402
from benchmarks.serving.matrix_spec import (Matrix, parse_list, parse_prompts,  # noqa: E402
                                            parse_tokens)


def test_rows_run_concurrency_major_with_per_row_prompts():
    m = Matrix(isls=parse_list("1k,128k"), concs=parse_list("1,8,32"), osl=256,
               prompts=parse_prompts("1=4,8=8,32=32,128kx1=2"))
    assert parse_tokens("8k") == 8192 and parse_tokens("131072") == 131072
    assert m.rows() == [(1024, 1), (131072, 1), (1024, 8), (131072, 8), (1024, 32), (131072, 32)]
    assert [m.num_prompts(i, c) for i, c in m.rows()] == [4, 2, 8, 8, 32, 32]
    assert Matrix(isls=(1024,), concs=(4,), osl=8, prompts={}).num_prompts(1024, 4) == 4
    with pytest.raises(Exception, match="want C=N"):
        parse_prompts("8")


def test_bench_and_warmup_arguments():
    args = bench_args(8000, "/m", 8192, 256, 8, 8, Path("/r"), "x.json", ready_check_s=20)
    assert args[:2] == ["bench", "serve"]
    for flag, value in (("--random-input-len", "8192"), ("--random-output-len", "256"),
                        ("--max-concurrency", "8"), ("--ready-check-timeout-sec", "20"),
                        ("--result-filename", "x.json"), ("--temperature", "0")):
        assert args[args.index(flag) + 1] == value
    assert "--ignore-eos" in args and "--save-result" in args and "--save-detailed" in args
    warm = warmup_args(args, 8, 16, 4096)
    assert "--save-result" not in warm and "--result-dir" not in warm
    assert "--save-detailed" not in warm
    assert warm[warm.index("--random-input-len") + 1] == "4096"
    assert warm[warm.index("--random-output-len") + 1] == "16"
    assert warm[warm.index("--seed") + 1] == "1"


def test_result_keeps_per_request_ttfts_when_bench_saved_them(tmp_path):
    from benchmarks.serving.bench_serve import read_result
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"completed": 2, "failed": 0, "median_ttft_ms": 40.0,
                             "ttfts": [0.0412, 0.0398]}))
    r = read_result(f, 2)
    assert r["ok"] and r["ttfts_ms"] == [41.2, 39.8]
    f.write_text(json.dumps({"completed": 1, "failed": 1}))
    r = read_result(f, 2)
    assert not r["ok"] and "ttfts_ms" not in r
    assert read_result(tmp_path / "none.json", 2) == {"ok": False,
                                                      "error": "no result file none.json"}


def side_json(path: Path, side: str, date: str, vllm: str, rows: dict, starts: list) -> str:
    state = {"side": side, "what": f"side {side}", "env": {"VLLM_MINIMAX_M3_MSA": side},
             "meta": {"date": date, "gpu": "NVIDIA H200", "vllm": vllm, "torch": "2.11.0",
                      "commit": f"c0ffee{side}", "bench_mode": "worker", "layers": 4,
                      "model": "hidden_size=6144", "max_model_len": 132096, "mode": "gpu",
                      "warmup": "16 output tokens"},
             "servers": [{"start_s": s, "reason": why, "flags": "--block-size 128"}
                         for s, why in starts],
             "rows": rows}
    path.write_text(json.dumps(state))
    return str(path)


def ok_row(isl, conc, tput, ttft, tpot, n=None):
    return {"isl": isl, "osl": 256, "concurrency": conc, "num_prompts": n or conc,
            "status": "ok", "output_throughput": tput, "median_ttft_ms": ttft,
            "median_tpot_ms": tpot, "cmd": "vllm bench serve ..."}


def not_run(isl, conc):
    return {"isl": isl, "osl": 256, "concurrency": conc, "num_prompts": conc,
            "status": "not run", "reason": "deadline reached"}


def test_report_joins_runs_and_gives_ratios_against_a(tmp_path):
    run1, run2, run3 = (tmp_path / d for d in ("run1", "run2", "run3"))
    for d in (run1, run2, run3):
        d.mkdir()
    crashed = {"isl": 1024, "osl": 256, "concurrency": 8, "num_prompts": 8, "status": "crashed",
               "reason": "server died in the warm-up (server exited)",
               "error_line": "torch.AcceleratorError: CUDA error: an illegal memory access",
               "log_tail": "line 1\n[rank0]: CUDA error: an illegal memory access was encountered"}
    files = [
        side_json(run1 / "side-B.json", "B", "2026-12-05T10:00:00+00:00", "0.26.0+m3.gabc",
                  {"isl1024-c1": ok_row(1024, 1, 200.0, 20.0, 4.0, n=4),
                   "isl1024-c8": ok_row(1024, 8, 1000.0, 50.0, 6.0)},
                  [(95.5, "first")]),
        side_json(run1 / "side-A.json", "A", "2026-12-05T10:06:00+00:00", "0.26.0+m3.gabc",
                  {"isl1024-c1": ok_row(1024, 1, 100.0, 40.0, 5.0, n=4), "isl1024-c8": crashed},
                  [(44.0, "first"), (41.0, "restart before isl1024-c8")]),
        side_json(run2 / "side-C.json", "C", "2026-12-05T11:00:00+00:00", "0.23.0+m3.gdef",
                  {"isl1024-c1": ok_row(1024, 1, 150.0, 30.0, 5.0, n=4),
                   "isl1024-c8": not_run(1024, 8)},
                  [(120.0, "first")]),
        # a later run of A that did not reach isl1024-c1 keeps run 1's numbers for it
        side_json(run3 / "side-A.json", "A", "2026-12-05T12:00:00+00:00", "0.26.0+m3.gabc",
                  {"isl1024-c1": not_run(1024, 1)}, []),
    ]
    sides = merge(files)
    assert list(sides) == ["A", "B", "C"]
    assert sides["A"]["rows"]["isl1024-c1 osl256"]["status"] == "ok"
    md = render(sides)
    # one row per (ISL, concurrency); A, B, C cells, then B/A and C/A
    assert "| 1024 / 256 | 1 | 4 | 100.0 | 200.0 | 150.0 | 2.00 | 1.50 |" in md
    assert "| 1024 / 256 | 1 | 4 | 40.0 | 20.0 | 30.0 | 0.50 | 0.75 |" in md
    assert "| 1024 / 256 | 1 | 4 | 5.00 | 4.00 | 5.00 | 0.80 | 1.00 |" in md
    assert "| 1024 / 256 | 8 | 8 | crashed | 1000.0 | not run | n/a | n/a |" in md
    # per side: date, GPU, vllm, commit, every start-up with its reason
    for text in ("2026-12-05T10:06:00+00:00", "NVIDIA H200", "0.23.0+m3.gdef", "c0ffeeC",
                 "44.0 (first); 41.0 (restart before isl1024-c8)", "95.5 (first)"):
        assert text in md
    assert "illegal memory access was encountered" in md and "| A | isl1024-c8 | crashed |" in md
    assert "### A isl1024-c8: server died in the warm-up" in md
    assert "| C | isl1024-c8 | not run | deadline reached |" in md
    # a row at another OSL is a row of its own, never joined with these
    other = dict(ok_row(1024, 1, 999.0, 1.0, 1.0, n=4), osl=8)
    md8 = render(merge(files + [side_json(tmp_path / "side-C.json", "C", "2026-12-06", "0.23.0+m3",
                                          {"isl1024-c1": other}, [])]))
    assert "| 1024 / 8 | 1 | 4 | - | - | 999.0 | n/a | n/a |" in md8
    assert "| 1024 / 256 | 1 | 4 | 100.0 | 200.0 | 150.0 | 2.00 | 1.50 |" in md8
    out = write_report(files, tmp_path / "joined")
    assert out.read_text() == md and json.loads((tmp_path / "joined" / "matrix.json").read_text())


def test_install_check_names_the_right_wheel():
    matrix.check_install(["A", "B"], {"vllm": "0.26.0+m3.g123"})
    matrix.check_install(["C"], {"vllm": "0.23.0+m3.g456"})
    with pytest.raises(matrix.UsageError, match=r"C needs 0\.23\.x\+m3"):
        matrix.check_install(["C"], {"vllm": "0.26.0+m3.g123"})
    with pytest.raises(matrix.UsageError, match="0.26.0'"):
        matrix.check_install(["A"], {"vllm": "0.26.0"})  # upstream's own wheel: no A/B switch
    with pytest.raises(matrix.UsageError, match="needs a GPU"):
        matrix.side_names("A,B", smoke=True)
    assert matrix.main(["run", "--sides", "B,A", "--isl", "300k", "--dry-run"]) == 2
    assert matrix.main(["run", "--sides", "B,A", "--dry-run"]) == 0


FAKE_CLI = textwrap.dedent("""
    import sys, time
    def main():
        what = sys.argv[1]
        if what == "ok":
            open(sys.argv[2], "w").write("ran")
        elif what == "raise":
            raise RuntimeError("bench failed")
        elif what == "exit":
            sys.exit(3)
        elif what == "hang":
            time.sleep(120)
""")


def test_bench_worker_runs_reports_and_recovers(tmp_path, monkeypatch):
    (tmp_path / "fake_cli.py").write_text(FAKE_CLI)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    worker = BenchWorker(tmp_path / "bench.log", tmp_path / "status", entry="fake_cli:main")
    try:
        first = worker.run(["ok", str(tmp_path / "a")], "first", timeout=120)
        pid = worker.proc.pid
        assert first["rc"] == 0 and (tmp_path / "a").read_text() == "ran"
        failed = worker.run(["raise"], "raises", timeout=120)
        assert failed["rc"] == 1 and "RuntimeError: bench failed" in failed["error"]
        assert worker.run(["exit"], "exits", timeout=120)["rc"] == 3
        assert worker.proc.pid == pid  # one process for all of these
        assert worker.run(["hang"], "hangs", timeout=2)["rc"] == "timeout"
        assert worker.proc is None  # killed; the next run starts a new worker
        assert worker.run(["ok", str(tmp_path / "b")], "again", timeout=120)["rc"] == 0
        assert worker.proc.pid != pid
    finally:
        worker.close()
    log = (tmp_path / "bench.log").read_text()
    assert "===== " in log and "first" in log and "again" in log


def test_error_line_prefers_the_cuda_error_and_skips_warnings():
    from benchmarks.serving.matrix_side import error_excerpt, error_line
    log = "\n".join([
        "(APIServer pid=1) WARNING [system_utils.py] fd limit errors like `OSError: [Errno 24]`",
        "(EngineCore pid=2) ERROR [core.py] EngineCore encountered a fatal error.",
        "[rank0]: torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."])
    assert "illegal memory access" in error_line(log)
    assert error_line("\n".join(log.splitlines()[:2] + log.splitlines()[3:])).startswith(
        "vllm.v1.engine.exceptions.EngineDeadError")
    assert error_line("INFO all fine\nWARNING RuntimeError: quoted") is None
    excerpt = error_excerpt("\n".join(f"INFO {i}" for i in range(50)) + "\n" + log)
    assert excerpt.splitlines()[0] == "INFO 47"  # five lines before the CUDA error
    assert "illegal memory access" in excerpt.splitlines()[5]


def test_kernels_compiled_inside_requests_are_read_from_the_log_and_reported(tmp_path):
    """vLLM's JIT-monitor lines in the server log become per-row lists (repeats are
    separate variants), and the report names them per row with each side's series
    warm-up line; rows that compiled nothing stay out of the table."""
    from benchmarks.serving.matrix_side import jit_compiles

    log = ("(EngineCore pid=1) WARNING 12-05 14:21:17 [jit_monitor.py:135] Triton kernel JIT "
           "compilation during inference: _compute_slot_mapping_kernel. \n"
           "INFO unrelated line\n"
           "WARNING [jit_monitor.py:135] Triton kernel JIT compilation during inference: "
           "fused_moe_kernel. constexprs={BLOCK_SIZE_M=16}; key=...\n"
           "WARNING Triton kernel JIT compilation during inference: fused_moe_kernel.\n")
    assert jit_compiles(log) == ["_compute_slot_mapping_kernel", "fused_moe_kernel",
                                 "fused_moe_kernel"]
    assert jit_compiles("INFO no compiles here\n") == []
    hit = dict(ok_row(8192, 8, 200.0, 7000.0, 3.0), jit_in_warmup=["fused_moe_kernel"] * 2,
               jit_in_run=["index_block_max_decode_kernel"])
    clean = dict(ok_row(1024, 1, 380.0, 30.0, 2.5), jit_in_warmup=[], jit_in_run=[])
    path = side_json(tmp_path / "side-B.json", "B", "2026-12-05", "0.26.0+m3",
                     {"1k-c1": clean, "8k-c8": hit}, [(94.0, "first")])
    state = json.loads(Path(path).read_text())
    state["servers"][0]["series_warmup"] = ("Series MiniMax-M3 MSA warm-up: 2083 launch plans "
                                            "compiled 97 kernel variants")
    Path(path).write_text(json.dumps(state))
    text = render(merge([path]))
    section = text[text.index("## Kernels compiled inside requests"):]
    assert "B start-up: Series MiniMax-M3 MSA warm-up: 2083 launch plans" in section
    assert "| B | 8192 / 256 x 8 | `fused_moe_kernel` x2 | `index_block_max_decode_kernel` |" \
        in section
    assert "1024 / 256 x 1" not in section
    # side files from before these fields: no section at all
    old = side_json(tmp_path / "side-A.json", "A", "2026-12-05", "0.26.0+m3",
                    {"1k-c1": ok_row(1024, 1, 300.0, 40.0, 3.0)}, [(170.0, "first")])
    assert "Kernels compiled inside requests" not in render(merge([old]))
