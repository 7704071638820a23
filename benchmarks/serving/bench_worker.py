# SPDX-License-Identifier: Apache-2.0
"""The bench worker (see ``bench_serve.BenchWorker``): imports vLLM's CLI entry point
once, then for every JSON line on stdin (``{"args": [...], "title": ..., "status":
path}``) runs it as ``vllm <args>`` would and writes ``{"rc": 0 | code, "error": ...}``
to the status file (atomically).  Output goes to stdout (the caller's bench.log).

  python -m benchmarks.serving.bench_worker [--entry vllm.entrypoints.cli.main:main]
"""

import argparse
import importlib
import json
import os
import sys
import time
import traceback


def load_entry(entry: str):
    module, _, func = entry.partition(":")
    return getattr(importlib.import_module(module), func)


def run_one(main, args: list[str]) -> dict:
    """``main()`` with ``sys.argv = ["vllm", *args]``: exit code 0 unless it raised
    (SystemExit keeps its code)."""
    sys.argv = ["vllm", *args]
    try:
        main()
        return {"rc": 0}
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        return {"rc": code} if code == 0 else {"rc": code, "error": f"SystemExit({e.code!r})"}
    except Exception as e:  # the benchmark's own failure: reported, the worker goes on
        return {"rc": 1, "error": f"{type(e).__name__}: {e}"[:2000],
                "traceback": traceback.format_exc()[-3000:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entry", default="vllm.entrypoints.cli.main:main")
    entry = load_entry(ap.parse_args().entry)
    print(f"bench worker {os.getpid()} ready", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        print(f"\n===== {time.strftime('%H:%M:%S')} {req['title']}\n"
              f"vllm {' '.join(req['args'])}", flush=True)
        status = run_one(entry, req["args"])
        sys.stdout.flush()
        sys.stderr.flush()
        tmp = req["status"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(status, f)
        os.replace(tmp, req["status"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
