"""Tooling for the MiniMax-M3 patch series on top of a pinned vLLM release.

Modules:
  errors   -- the one exception type every user-facing failure raises
  gitutil  -- tiny, project-agnostic git helpers (GitPython)
  pin      -- the pinned base (patches/base.json)
  fetch    -- artifacts from the package index pip is configured for, sha256-verified
  series   -- the order file, patch files and overlay files; the series hash
  applier  -- base + series -> a git tree with one commit per entry
  exporter -- that git tree -> patches/ and vllm_overlay/ again (byte-stable)
  wheel    -- graft the patched Python files onto the official precompiled wheel
  txn      -- write a set of series files together, or none of them
  importer -- an upstream fix (patch file, commit, clone ref) -> a new entry, verified first
  rebaser  -- the series onto another vLLM base: per-entry report, optional write
  image    -- Dockerfile + build context overlaying the series onto a vLLM image
"""
