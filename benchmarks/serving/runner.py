# SPDX-License-Identifier: Apache-2.0
"""Runs the jobs grouped by server configuration, under the deadline."""

import asyncio
import random
import time
import traceback

from .bench_ab import bench_ab_jobs
from .client import rand_ids, run_async, timed_stream
from .jobs import Job, concurrency_jobs, main_cfg, serve_jobs, throughput_jobs
from .report import write_report
from .server import Plan, Server, ServerCfg, Stop, server_key


def warm_up(server: Server, plan: Plan) -> None:
    """Before any measurement: a few concurrent short requests and one prompt of
    min(8192, max_len / 2) tokens, so Triton JIT and first-call costs are not
    timed; records the seconds."""
    t0 = time.monotonic()
    rng = random.Random(3)
    long_len = min(8192, plan.max_len // 2)

    async def body(aclient):
        await asyncio.gather(*(timed_stream(aclient, rand_ids(rng, 64 + 32 * i, plan.vocab), 8)
                               for i in range(4)))
        await timed_stream(aclient, rand_ids(rng, long_len, plan.vocab), 8)

    run_async(server, plan.request_timeout, body)
    server.record["warmup_s"] = round(time.monotonic() - t0, 1)


class Pool:
    """At most one running server; reused while the requested key matches.
    A configuration that failed to start is not retried."""

    def __init__(self, plan: Plan, records: list):
        self.plan, self.records = plan, records
        self.key, self.server, self.failed = None, None, {}

    def get(self, cfg: ServerCfg) -> Server:
        key = server_key(cfg, self.plan)
        if key in self.failed:
            raise RuntimeError(f"server {cfg.label} failed to start earlier: {self.failed[key]}")
        if key == self.key and self.server.proc.poll() is None:
            return self.server
        self.close()
        server = Server(cfg, self.plan)
        self.records.append(server.record)
        self.key, self.server = key, server  # close() stops it, whatever happens next
        try:
            server.start()
            warm_up(server, self.plan)
        except Exception as e:
            server.record["error"] = f"{type(e).__name__}: {e}"[:300]
            self.failed[key] = server.record["error"].splitlines()[0]
            self.close()
            raise
        return server

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.key, self.server = None, None


JOBS = {"serve": serve_jobs, "concurrency": concurrency_jobs,
        "throughput": throughput_jobs, "bench_ab": bench_ab_jobs}


def order_jobs(jobs: list[Job], plan: Plan) -> list[Job]:
    """Group jobs by server (main configuration first, then first appearance);
    within a server keep the sections' order.  Each server starts once."""
    keys = [server_key(main_cfg(plan), plan)]
    for j in jobs:
        if server_key(j.cfg, plan) not in keys:
            keys.append(server_key(j.cfg, plan))
    return sorted(jobs, key=lambda j: keys.index(server_key(j.cfg, plan)))


def run_jobs(jobs: list[Job], plan: Plan, state: dict) -> None:
    """Run every job on its server; record each result (or error / skip) and
    rewrite the report after each."""
    pool = Pool(plan, state["servers"])
    try:
        for job in order_jobs(jobs, plan):
            slot = state["results"].setdefault(job.section, {})
            if plan.remaining() <= 0:
                slot[job.name] = {"ok": False, "skipped": "deadline reached"}
                continue
            t0 = time.monotonic()
            try:
                server = pool.get(job.cfg)
                slot[job.name] = job.fn(server, plan)
            except Stop:
                slot[job.name] = {"ok": False, "error": "stopped (SIGTERM)"}
                raise
            except Exception as e:
                slot[job.name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:1500],
                                  "traceback": traceback.format_exc()[-1500:]}
            slot[job.name]["job_s"] = round(time.monotonic() - t0, 1)
            slot[job.name]["server"] = job.cfg.label
            write_report(plan, state)
    finally:
        pool.close()
        write_report(plan, state)

