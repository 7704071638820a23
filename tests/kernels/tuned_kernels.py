# SPDX-License-Identifier: Apache-2.0
"""The kernel tests' (and benchmarks') way to a launch-shape override: the
product's kernel wrappers take none; ``tuned(op, fn)`` is ``fn`` taking a
``_tune`` dict, the call run inside ``triton_ops.launch_overrides(op, **_tune)``
(``benchmarks/msa/harness.py`` has the same for the benchmarks)."""

import functools


def tuned(op: str, fn):
    @functools.wraps(fn)
    def call(*args, _tune=None, **kwargs):
        from vllm.models.minimax_m3.common.triton_ops import launch_overrides

        with launch_overrides(op, **(_tune or {})):
            return fn(*args, **kwargs)

    return call
