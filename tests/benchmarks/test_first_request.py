# SPDX-License-Identifier: Apache-2.0
"""The first-request probe of the serving matrix (benchmarks/serving/first_request.py,
issue 48 item 5): against a fake streaming completions server, a first request that is
slower than its repeats is caught and one that is not passes; the side runner records
errors instead of raising and says whether the length was new to the server; the report
lists it."""

import json
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.serving.first_request import LIMIT, first_and_repeats, summarize  # noqa: E402
from benchmarks.serving.matrix_report import merge, render  # noqa: E402
from benchmarks.serving.probe_client_cost import InstantCompletions  # noqa: E402
from benchmarks.serving.probe_client_cost import main as client_cost_main  # noqa: E402

pytest.importorskip("httpx", reason="the probe's client is httpx (a dependency of vLLM's openai)")


class FakeCompletions(InstantCompletions):
    """GET /v1/models as InstantCompletions (the probe's client warms its connection
    there); POST /v1/completions, streamed: sleeps ``base_s`` (plus ``first_extra_s`` on
    the first request it serves), then sends one text chunk, a usage chunk and [DONE]."""
    base_s, first_extra_s, status = 0.15, 0.0, 200
    requests: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        time.sleep(self.base_s + (self.first_extra_s if len(self.requests) == 1 else 0.0))
        if self.status != 200:
            self.send_response(self.status)
            self.end_headers()
            self.wfile.write(b'{"error": "prompt too long"}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunk = {"id": "c", "object": "text_completion", "created": 0, "model": body["model"],
                 "choices": [{"index": 0, "text": "a", "logprobs": None, "finish_reason": None}]}
        usage = dict(chunk, choices=[], usage={"prompt_tokens": len(body["prompt"]),
                                               "completion_tokens": 1, "total_tokens": 1})
        for event in (chunk, usage):
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture
def fake_server():
    def start(first_extra_s: float, status: int = 200):
        handler = type("Handler", (FakeCompletions,), {"first_extra_s": first_extra_s,
                                                       "requests": [], "status": status})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
        return httpd, handler

    servers = []
    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def test_a_first_request_slower_than_its_repeats_is_caught(fake_server):
    httpd, handler = fake_server(first_extra_s=0.6)
    r = first_and_repeats(httpd, isl=300, vocab=1000, repeats=3, timeout=30)
    assert len(handler.requests) == 4
    assert all(len(b["prompt"]) == 300 and b["stream"] for b in handler.requests)
    assert len({tuple(b["prompt"]) for b in handler.requests}) == 4  # fresh tokens each
    assert r["first_ttft_ms"] >= 700 and len(r["repeat_ttft_ms"]) == 3
    assert r["first_over_repeat"] > 3 and r["within_limit"] is False


def test_a_first_request_as_fast_as_its_repeats_passes(fake_server):
    httpd, _ = fake_server(first_extra_s=0.0)
    r = first_and_repeats(httpd, isl=64, vocab=1000, repeats=2, timeout=30)
    assert r["first_over_repeat"] < LIMIT and r["within_limit"] is True


def test_the_servers_first_request_is_timed_apart_from_the_first_at_a_length(fake_server):
    """A server whose very first request is slow (front-end warm-up, not a prompt length):
    with ``server_warm_isl`` that cost lands in ``server_first_ttft_ms`` and the first
    request at the probed length is compared with its repeats on its own."""
    httpd, handler = fake_server(first_extra_s=0.6)
    r = first_and_repeats(httpd, isl=300, vocab=1000, repeats=2, timeout=30, server_warm_isl=16)
    assert [len(b["prompt"]) for b in handler.requests] == [16, 300, 300, 300]
    assert r["server_first_ttft_ms"] >= 700 and r["server_warm_isl"] == 16
    assert r["within_limit"] is True and r["first_over_repeat"] < LIMIT


def test_an_http_error_names_the_status_and_the_server_s_answer(fake_server):
    httpd, _ = fake_server(first_extra_s=0.0, status=400)
    with pytest.raises(RuntimeError, match="HTTP 400 .*prompt too long"):
        first_and_repeats(httpd, isl=8, vocab=1000, repeats=1, timeout=30)


def test_summary_needs_a_repeat_and_bad_sizes_are_refused():
    assert summarize([130.0, 100.0, 90.0, 110.0])["first_over_repeat"] == 1.3
    with pytest.raises(ValueError, match="at least one repeat"):
        summarize([100.0])
    with pytest.raises(ValueError, match="must be positive"):
        first_and_repeats(object(), isl=0, vocab=1000)
    with pytest.raises(ValueError, match="must be positive"):
        first_and_repeats(object(), isl=8, vocab=1000, server_warm_isl=0)


def test_the_side_runner_records_errors_and_whether_the_length_was_new(tmp_path, fake_server):
    from benchmarks.serving.matrix_side import SideRun
    from benchmarks.serving.matrix_spec import SIDES, Matrix
    from benchmarks.serving.server import Plan

    plan = Plan(smoke=True, out=tmp_path, work=tmp_path, vocab=1000)
    m = Matrix(isls=(256,), concs=(1,), osl=4, prompts={}, first_repeats=1)
    run = SideRun(SIDES["B"], plan, m, bench=None, meta={})
    run.server, _ = fake_server(first_extra_s=0.0)
    first = run.first_request(256)
    assert first["fresh"] is True and first["within_limit"] in (True, False)
    assert first["server_warm_isl"] == 16     # the server had served nothing yet
    run.lengths_seen.add(256)
    again = run.first_request(256)
    assert again["fresh"] is False and "server_first_ttft_ms" not in again
    run.server = type("Gone", (), {"url": "http://127.0.0.1:9"})()  # nothing listens
    gone = run.first_request(512)
    assert gone["fresh"] is True and "error" in gone and "first_ttft_ms" not in gone


def test_the_report_lists_the_probe_and_flags_a_slow_first_request(tmp_path):
    row = {"isl": 1024, "osl": 256, "concurrency": 1, "num_prompts": 4, "status": "ok",
           "output_throughput": 300.0, "median_ttft_ms": 40.0, "median_tpot_ms": 3.0}
    slow = dict(row, first_request=dict(summarize([120.0, 40.0, 41.0, 39.0]), fresh=True,
                                        jit=["_topk_index_kernel"]))
    fine = dict(row, isl=32768, first_request=dict(summarize([380.0, 377.0, 379.0]),
                                                   fresh=True, jit=[], client="httpx",
                                                   server_first_ttft_ms=95.5, server_warm_isl=16))
    broken = dict(row, isl=8192, first_request={"error": "APIConnectionError: refused",
                                                "fresh": True})
    state = {"side": "A", "what": "side A", "env": {}, "meta": {"date": "2026-12-07"},
             "servers": [], "rows": {"a": slow, "b": fine, "c": broken}}
    (tmp_path / "a.json").write_text(json.dumps(state))
    sides = merge([str(tmp_path / "a.json")])
    text = render(sides)
    section = text[text.index("## First request at a new prompt length"):]
    assert "| A | 1024 | yes | 120.0 | 40.0, 41.0, 39.0 | 3.00 | **no** | `_topk_index_kernel` |" \
        in section
    assert "| A | 32768 | yes | 380.0 | 377.0, 379.0 | 1.00 | yes | none |" in section
    assert "| A | 8192 | yes | failed: APIConnectionError: refused |" in section
    assert "A: 95.5 ms TTFT for 16 tokens" in section
    assert "Probes without a `client` field" in section  # rows a and c: the old client
    del state["rows"]["a"]["first_request"]["jit"]  # a side C file from before 2026-12-08
    (tmp_path / "c.json").write_text(json.dumps(state))
    assert "| 3.00 | **no** | not monitored |" in render(merge([str(tmp_path / "c.json")]))
    del state["rows"]["a"]["first_request"], state["rows"]["b"]["first_request"]
    del state["rows"]["c"]["first_request"]
    (tmp_path / "b.json").write_text(json.dumps(state))
    assert "First request at a new prompt length" not in render(merge([str(tmp_path / "b.json")]))



def test_the_client_cost_benchmark_prints_both_clients(capsys):
    pytest.importorskip("openai", reason="the old probe's client is vLLM's dependency openai")
    client_cost_main(["--isl", "64", "--repeats", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 64 |")]
    assert len(rows) == 2 and "OpenAI client" in rows[0] and "raw" in rows[1]
    assert all(float(cell) > 0 for row in rows for cell in row.strip("|").split("|")[2:])
