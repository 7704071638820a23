# SPDX-License-Identifier: Apache-2.0
"""What the first-request probe's HTTP client adds to each TTFT it measures, on this
machine: against an in-process server that answers a streamed completion at once, the
TTFT is the client's own cost (request building, JSON of the prompt's token ids, the
connection). Compares the OpenAI client (``client.timed_stream``, the probe's client up
to 2026-12-07) with the raw client the probe uses now (``first_request``: body serialized
before the clock, a warmed connection).

    python -m benchmarks.serving.probe_client_cost [--isl 1024,32768] [--repeats 5]

Prints a markdown table: per prompt length and client, the first call's and the
repeats' median TTFT in ms.
"""

import argparse
import json
import random
import statistics
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class InstantCompletions(BaseHTTPRequestHandler):
    """GET: an empty model list; POST: one completion chunk and [DONE], in one write."""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"object": "list", "data": []}')

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        chunk = {"id": "c", "object": "text_completion", "created": 0, "model": "m",
                 "choices": [{"index": 0, "text": "a", "logprobs": None, "finish_reason": None}]}
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())

    def log_message(self, *args):
        pass


def openai_client_ttfts(server, isl: int, n: int, rng: random.Random) -> list[float]:
    from .client import rand_ids, run_async, timed_stream

    async def body(aclient):
        out = []
        for _ in range(n):
            r = await timed_stream(aclient, rand_ids(rng, isl, 32000), 2)
            out.append((r["first"] - r["t0"]) * 1e3)
        return out

    return run_async(server, 60, body)


def raw_client_ttfts(server, isl: int, n: int) -> list[float]:
    from .first_request import first_and_repeats

    r = first_and_repeats(server, isl, 32000, repeats=n - 1, timeout=60)
    return [r["first_ttft_ms"], *r["repeat_ttft_ms"]]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serving.probe_client_cost")
    p.add_argument("--isl", default="1024,32768")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), InstantCompletions)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    rng = random.Random(0)
    print("| prompt ids | client | first call, ms | repeats' median, ms |\n|---|---|---|---|")
    try:
        for isl in (int(x) for x in a.isl.split(",")):
            for name, ttfts in (("OpenAI client (old probe)",
                                 openai_client_ttfts(httpd, isl, 1 + a.repeats, rng)),
                                ("raw, body serialized first (probe now)",
                                 raw_client_ttfts(httpd, isl, 1 + a.repeats))):
                print(f"| {isl} | {name} | {ttfts[0]:.1f} | {statistics.median(ttfts[1:]):.1f} |")
    finally:
        httpd.shutdown()
        httpd.server_close()


if __name__ == "__main__":
    main()
