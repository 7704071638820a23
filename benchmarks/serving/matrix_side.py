# SPDX-License-Identifier: Apache-2.0
"""One side of the serving matrix (see ``matrix``): its `vllm serve` (started again
after a crash), its rows (warm-up, recorded `vllm bench serve`, outcome), its JSON."""

import datetime
import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

from .bench_serve import bench_args, display_cmd, read_result, run_cli, warmup_args
from .first_request import SERVER_WARM_ISL, first_and_repeats
from .matrix_spec import Matrix, Side, row_name
from .server import Plan, Server, ServerCfg, Stop

# the most telling lines of a dead server's log, best first
ERROR_PATTERNS = (re.compile(r"illegal memory access|CUDA error"),
                  re.compile(r"\b\w+(Error|Exception): "), re.compile(r"\bERROR\b"))


def log_size(path: Path) -> int:
    """Bytes in a log so far (0 before it exists): where the next read starts."""
    return path.stat().st_size if path.exists() else 0


def error_line(text: str) -> str | None:
    """The first CUDA error of a server log, else the first exception or ERROR line
    (WARNING lines, which can quote error names, are skipped)."""
    lines = [ln for ln in text.splitlines() if "WARNING" not in ln]
    for pat in ERROR_PATTERNS:
        hit = next((ln for ln in lines if pat.search(ln)), None)
        if hit:
            return hit.strip()[:300]
    return None


def error_excerpt(text: str, before: int = 5, size: int = 3000) -> str | None:
    """The log from a few lines before its first CUDA error or exception on (the root
    cause; the tail after a crash is mostly the API server shutting down)."""
    lines = text.splitlines()
    for pat in ERROR_PATTERNS[:2]:
        i = next((k for k, ln in enumerate(lines) if "WARNING" not in ln and pat.search(ln)), None)
        if i is not None:
            return "\n".join(lines[max(0, i - before):])[:size]
    return None


def healthy(server: Server) -> bool:
    try:
        return urllib.request.urlopen(server.url + "/health", timeout=5).status == 200
    except OSError:
        return False


def server_state(server: Server, settle_s: float) -> str:
    """'alive', 'exited' or 'unhealthy'; waits up to ``settle_s`` for an exit first
    (a server whose engine died takes a moment to go)."""
    end = time.monotonic() + settle_s
    while server.proc.poll() is None and time.monotonic() < end:
        time.sleep(1)
    if server.proc.poll() is not None:
        return "exited"
    return "alive" if healthy(server) else "unhealthy"


def wait_gpu_idle(timeout: float = 30.0) -> None:
    """Until no process holds the GPU (a killed engine frees its memory late)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            return
        if not out.strip():
            return
        time.sleep(2)


class SideRun:
    """One side: its servers (restarted after a crash), its rows, its JSON."""

    def __init__(self, side: Side, plan: Plan, m: Matrix, bench, meta: dict, extra_env: tuple = (),
                 extra_args: tuple = (), on_save=None):
        """``bench``: a BenchWorker or CliBench; ``on_save()`` runs after every JSON
        write (the caller rewrites its report, so a killed job still leaves one)."""
        self.side, self.plan, self.m, self.bench, self.on_save = side, plan, m, bench, on_save
        self.cfg = ServerCfg(kv=plan.main_kv, graphs=not plan.smoke, fold=True,
                             max_len=plan.max_len, env=side.env + extra_env,
                             extra_args=side.serve_args + tuple(extra_args))
        self.path = plan.out / f"side-{side.name}.json"
        self.server, self.log_offset, self.failed_starts = None, 0, 0
        self.lengths_seen = set()  # prompt lengths the current server has served
        self.t0 = time.monotonic()
        self.state = {"side": side.name, "what": side.what, "env": dict(self.cfg.environment()),
                      "meta": dict(meta, date=now()), "servers": [], "rows": {}}
        for isl, c in m.rows():
            self.state["rows"][row_name(isl, c)] = {
                "isl": isl, "osl": m.osl, "concurrency": c, "num_prompts": m.num_prompts(isl, c),
                "status": "not run", "reason": "not reached"}
        self.save()

    def save(self) -> None:
        self.state["meta"]["wall_s"] = round(time.monotonic() - self.t0, 1)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1, default=str))
        os.replace(tmp, self.path)
        if self.on_save:
            self.on_save()

    def remaining(self) -> float:
        return self.plan.remaining() - self.m.reserve_s

    def server_log(self) -> str:
        """serve.log since this side's current server started."""
        return read_from(self.plan.out / "serve.log", self.log_offset)

    # servers -------------------------------------------------------------------------------
    def start_server(self, reason: str) -> bool:
        log = self.plan.out / "serve.log"
        self.log_offset = log_size(log)
        server = Server(self.cfg, self.plan)
        server.record.update(reason=reason, started_at_s=round(time.monotonic() - self.t0, 1))
        self.state["servers"].append(server.record)
        self.server = server
        self.lengths_seen = set()
        try:
            server.start()
        except Exception as e:
            text = self.server_log()
            server.record.update(error=f"{type(e).__name__}: {e}".splitlines()[0][:300],
                                 error_line=error_line(text), log_excerpt=error_excerpt(text),
                                 log_tail=text[-4000:])
            self.stop_server(grace=15)
            self.failed_starts += 1
            return False
        self.failed_starts = 0
        text = self.server_log()
        if self.side.version_prefix == "0.26.":  # which MSA path the engine says it took
            server.record["msa_path_in_log"] = (
                "series" if "selected the series' MSA ops" in text else "upstream (no series line)")
        warm = re.search(r"(?:Series )?MiniMax-M3 MSA warm-up: [^\n]*", text)
        if warm:
            server.record["series_warmup"] = warm.group(0).rstrip()
        if "disabling vLLM's torch.compile pipeline" in text:
            server.record["compile_note"] = "torch.compile off (VLLM_USE_BREAKABLE_CUDAGRAPH)"
        return True

    def stop_server(self, grace: float = 60.0) -> None:
        if self.server is not None:
            self.server.stop(grace)
            self.server = None
            if not self.plan.smoke:
                wait_gpu_idle()

    # rows ----------------------------------------------------------------------------------
    def run(self) -> None:
        self.t0 = time.monotonic()
        crashed_at = None
        try:
            for isl, c in self.m.rows():
                name = row_name(isl, c)
                row = self.state["rows"][name]
                if self.remaining() < self.m.min_row_s:
                    row["reason"] = "deadline reached"
                    continue
                if crashed_at is not None and self.m.on_crash == "skip-higher-concurrency" \
                        and c >= crashed_at:
                    row["reason"] = (f"skipped: the server crashed at concurrency {crashed_at} "
                                     "(--on-crash skip-higher-concurrency)")
                    continue
                if self.server is None or self.server.proc.poll() is not None:
                    if self.server is not None:  # died between rows
                        self.stop_server()
                    if self.failed_starts >= 2:
                        row["reason"] = "server did not start (twice); see the servers"
                        continue
                    if self.state["servers"] and 0 <= self.m.max_restarts < len(
                            self.state["servers"]):
                        row["reason"] = f"--max-restarts {self.m.max_restarts} reached"
                        continue
                    reason = "first" if not self.state["servers"] else f"restart before {name}"
                    if not self.start_server(reason):
                        row["reason"] = ("server did not start: "
                                         + self.state["servers"][-1].get("error", "?"))
                        if self.remaining() < 10:
                            row["reason"] = "deadline reached during the server start"
                        self.save()
                        continue
                if self.remaining() < self.m.min_row_s:  # the start took the time
                    row["reason"] = "deadline reached"
                    continue
                row.clear()
                row.update(self.run_row(isl, c))
                if row["status"] == "crashed":
                    crashed_at = c if crashed_at is None else min(crashed_at, c)
                    self.stop_server(grace=15)
                self.save()
        except (Stop, KeyboardInterrupt):
            self.mark_unreached("stopped (SIGTERM)")
            raise
        finally:
            self.stop_server()
            self.save()

    def mark_unreached(self, reason: str) -> None:
        for r in self.state["rows"].values():
            if r["status"] == "not run" and r.get("reason") == "not reached":
                r["reason"] = reason
        self.save()

    def timeout(self) -> float:
        return max(5.0, min(self.m.row_timeout, self.remaining()))

    def run_row(self, isl: int, c: int) -> dict:
        """Warm-up, then the recorded run; classify the outcome."""
        name, n, plan = row_name(isl, c), self.m.num_prompts(isl, c), self.plan
        rdir = plan.out / "bench"
        rdir.mkdir(exist_ok=True)
        result = rdir / f"{self.side.name}-{name}.json"
        result.unlink(missing_ok=True)
        args = bench_args(self.server.port, plan.model, isl, self.m.osl, c, n, rdir, result.name,
                          ready_check_s=self.m.ready_check_s)
        rec = {"isl": isl, "osl": self.m.osl, "concurrency": c, "num_prompts": n,
               "cmd": display_cmd(args, plan.model), "server": len(self.state["servers"])}
        bench_log = plan.out / "bench.log"
        bench_offset = log_size(bench_log)
        serve_log = plan.out / "serve.log"
        row_offset = log_size(serve_log)
        if self.m.warmup and c > 1:
            warm = warmup_args(args, c, self.m.warmup_osl, min(isl, self.m.warmup_isl))
            r = self.bench.run(warm, f"side {self.side.name} {name} warm-up (unrecorded)",
                               self.timeout())
            rec["warmup_s"] = r["wall_s"]
            if r["rc"] != 0:
                state = server_state(self.server, 10)
                if state != "alive":
                    return self.crashed(rec, f"in the warm-up (server {state})")
                if r["rc"] == "timeout":
                    return dict(rec, status="timeout", reason=f"warm-up: {r.get('error')}")
                rec["warmup_error"] = str(r.get("error") or f"rc {r['rc']}")[:300]
        if self.m.first_request and c == 1:
            probe_offset = log_size(serve_log)
            first = self.first_request(isl)
            first["jit"] = jit_compiles(read_from(serve_log, probe_offset))
            rec["first_request"] = first
            if "error" in first and server_state(self.server, 10) != "alive":
                return self.crashed(rec, "in the first-request probe")
        self.lengths_seen.add(isl)
        run_offset = log_size(serve_log)
        rec["jit_in_warmup"] = jit_compiles(
            read_from(serve_log, row_offset)[:run_offset - row_offset])
        r = self.bench.run(args, f"side {self.side.name} {name}", self.timeout())
        rec["bench_wall_s"] = r["wall_s"]
        rec["jit_in_run"] = jit_compiles(read_from(serve_log, run_offset))
        res = read_result(result, n)
        ok = r["rc"] == 0 and res.get("ok")
        state = server_state(self.server, 0 if ok else 10)
        rec.update({k: v for k, v in res.items() if k not in ("ok", "error")})
        if ok:
            if state != "alive":
                rec["note"] = f"server {state} right after the row (restarted for the next)"
            return dict(rec, status="ok")
        if state != "alive":
            return self.crashed(rec, f"during the run (server {state})")
        why = r.get("error") or res.get("error") or f"rc {r['rc']}"
        if res.get("completed") is not None and not res.get("ok"):
            why = f"{res['completed']} of {n} completed, {res.get('failed')} failed; {why}"
        if r["rc"] == "timeout" and self.remaining() <= 1:
            why = f"cut at the deadline: {why}"
        return dict(rec, status="timeout" if r["rc"] == "timeout" else "failed",
                    reason=str(why)[:500], bench_log_tail=read_from(bench_log, bench_offset)[-3000:])

    def first_request(self, isl: int) -> dict:
        """The first request at ``isl`` against its repeats (first_request.py); ``fresh``:
        the server had not served this length before. Errors are recorded, not raised."""
        fresh = isl not in self.lengths_seen
        try:  # the server's very first request is timed apart (SERVER_WARM_ISL tokens)
            r = first_and_repeats(self.server, isl, self.plan.vocab, self.m.first_repeats,
                                  timeout=self.timeout(), seed=isl,
                                  server_warm_isl=None if self.lengths_seen else SERVER_WARM_ISL)
        except Exception as e:  # the recorded run that follows says whether the server lives
            r = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
        return dict(r, fresh=fresh)

    def crashed(self, rec: dict, when: str) -> dict:
        text = self.server_log()
        return dict(rec, status="crashed", reason=f"server died {when}",
                    error_line=error_line(text), log_excerpt=error_excerpt(text),
                    log_tail=text[-4000:])


JIT_EVENT = re.compile(r"JIT compilation during inference: ([\w.]+?)\.?(?:\s|$)")


def jit_compiles(text: str) -> list[str]:
    """The kernels vLLM's JIT monitor saw compile in ``text`` (a server log slice),
    in log order, repeats kept (one per variant)."""
    return JIT_EVENT.findall(text)


def read_from(path: Path, offset: int) -> str:
    """The text of ``path`` from byte ``offset`` on ("" if unreadable)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class CliBench:
    """--bench-mode cli: `python -m vllm.entrypoints.cli.main <args>` per run."""

    def __init__(self, log_path: Path):
        self.log_path = log_path

    def run(self, args: list[str], title: str, timeout: float) -> dict:
        t0 = time.monotonic()
        with open(self.log_path, "a") as log:
            log.write(f"\n===== {time.strftime('%H:%M:%S')} {title}\nvllm {' '.join(args)}\n")
            log.flush()
            rc = run_cli(args, log, timeout)
        out = {"rc": rc, "wall_s": round(time.monotonic() - t0, 1)}
        if rc != 0:
            out["error"] = f"vllm bench serve rc {rc}; see bench.log"
        return out
