# SPDX-License-Identifier: Apache-2.0
"""A tiny MiniMax-M3 for the demo and the tests: no network, built in code.

``tokenizer.build_tokenizer`` is the one tokenizer builder (the demo's checkpoint and
the tests' checkpoints use it); ``python -m tiny_m3.demo`` is ``make demo``."""
