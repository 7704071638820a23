# SPDX-License-Identifier: Apache-2.0
"""The serving matrix's sides, rows and sizes (see ``matrix``): which install and
environment each side needs, the ISL x concurrency rows in run order, the number of
prompts per row, and a rough time estimate for planning (--dry-run)."""

import argparse
import dataclasses
import math

MSA_ENV = "VLLM_MINIMAX_M3_MSA"


@dataclasses.dataclass(frozen=True)
class Side:
    name: str
    what: str
    version_prefix: str  # the installed vLLM must start with it
    env: tuple = ()
    serve_args: tuple = ()  # more `vllm serve` flags for this side's servers


# vLLM logs Triton kernels compiled after start-up ("JIT compilation during inference"):
# 0.23.0 each kernel's first compile; from 0.24 every variant with --jit-monitor-verbose,
# which adds the variant's key (what the warm-up missed)
JIT_VERBOSE = ("--jit-monitor-verbose",)
SIDES = {
    "A": Side("A", "v0.26.0 wheel, upstream's MSA path", "0.26.", ((MSA_ENV, "upstream"),),
              JIT_VERBOSE),
    "B": Side("B", "v0.26.0 wheel, the series' MSA path", "0.26.", ((MSA_ENV, "series"),),
              JIT_VERBOSE),
    "C": Side("C", "v0.23.0 wheel with the series", "0.23.", ()),
}

GPU_DEFAULTS = dict(isl="1k,8k,32k,128k", concurrency="1,8,32", osl=256,
                    num_prompts="1=4,8=8,32=32,128kx1=2", max_model_len=132096,
                    warmup_isl=4096, warmup_osl=16, layers=4)
SMOKE_DEFAULTS = dict(isl="128,512", concurrency="1,2", osl=8, num_prompts="1=2,2=2",
                      max_model_len=1024, warmup_isl=128, warmup_osl=4, layers=2)

# Rough planning numbers for --dry-run only (H200, 4 layers, from the 2026-11-30
# bench_ab runs: ~60k prefill tok/s at 128k; ~110-140 s per cold `vllm serve` start).
PLAN_GUESS = dict(prefill_tok_s=60000.0, step_ms_b1=3.0, step_ms_per_seq=0.3,
                  row_overhead_s=6.0, start_s=120.0)


def parse_tokens(text: str) -> int:
    """'8k' -> 8192, '131072' -> 131072."""
    t = text.strip().lower()
    try:
        return int(t[:-1]) * 1024 if t.endswith("k") else int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a token count: {text!r} (e.g. 8192 or 8k)")


def parse_list(text: str) -> tuple:
    return tuple(parse_tokens(x) for x in text.split(",") if x.strip())


def parse_prompts(text: str) -> dict:
    """'1=4,8=8,128kx1=2' -> {(None, 1): 4, (None, 8): 8, (131072, 1): 2}:
    num-prompts per concurrency, or per ISL x concurrency."""
    table = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        key, sep, n = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"--num-prompts entry {item!r}: want C=N or ISLxC=N")
        isl, x, conc = key.rpartition("x")
        table[(parse_tokens(isl) if x else None, parse_tokens(conc))] = parse_tokens(n)
    return table


@dataclasses.dataclass
class Matrix:
    """The rows and how each is run."""
    isls: tuple
    concs: tuple
    osl: int
    prompts: dict
    warmup: bool = True
    warmup_isl: int = 4096
    warmup_osl: int = 16
    row_timeout: float = 300.0
    ready_check_s: int = 10  # bench retries its first request this long (a dead server)
    reserve_s: float = 15.0  # kept for stopping the server and the report
    min_row_s: float = 30.0  # no row starts with less time left than this
    on_crash: str = "restart"
    max_restarts: int = -1
    first_request: bool = True  # time the first request at each length (concurrency 1 rows)
    first_repeats: int = 3

    def rows(self) -> list[tuple[int, int]]:
        """Concurrency-major: the rows where upstream's path crashed come last."""
        return [(isl, c) for c in self.concs for isl in self.isls]

    def num_prompts(self, isl: int, conc: int) -> int:
        return self.prompts.get((isl, conc), self.prompts.get((None, conc), conc))


def row_name(isl: int, conc: int) -> str:
    return f"isl{isl}-c{conc}"


def estimate(m: Matrix, sides: int) -> tuple[list[str], float]:
    """Rows with their prefill tokens and a rough time (PLAN_GUESS), and the total."""
    g, lines = PLAN_GUESS, []
    total = sides * g["start_s"]
    for isl, c in m.rows():
        n = m.num_prompts(isl, c)
        step_ms = g["step_ms_b1"] + g["step_ms_per_seq"] * min(c, n)
        s = (n * isl / g["prefill_tok_s"] + math.ceil(n / c) * m.osl * step_ms / 1e3
             + g["row_overhead_s"] + (min(isl, m.warmup_isl) * c / g["prefill_tok_s"]
                                      if m.warmup and c > 1 else 0)
             + ((1 + m.first_repeats) * isl / g["prefill_tok_s"]
                if m.first_request and c == 1 else 0))
        total += sides * s
        lines.append(f"  {row_name(isl, c):>16}  prompts {n:>3}  prefill tokens "
                     f"{n * isl:>9}  ~{s:5.0f} s per side")
    return lines, total
