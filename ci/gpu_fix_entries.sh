#!/usr/bin/env bash
# GPU job: regression test of the upstream-fix entry vllm#51632 (fused shared expert) on the
# patched CUDA wheel, with the entry and with v0.23.0's behaviour. Run on the GPU machine after
# `bash .gpu/recv.sh install && . /tmp/gpu-env.sh` (../shared/gpu/README.md).
# Writes $OUT/fix_entries.md (dated table), $OUT/fix_entries.xml and the log.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
python -m pytest -v -p no:cacheprovider --junitxml="$OUT/fix_entries.xml" \
  tests/fixes/test_51632_fused_shared_expert.py 2>&1 | tee "$OUT/fix_entries.log"
rc=${PIPESTATUS[0]}
python - "$OUT" "$rc" <<'PY'
import subprocess, sys, datetime, os, xml.etree.ElementTree as ET
out, rc = sys.argv[1], sys.argv[2]
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip().splitlines()[0]
import vllm
rows = []
for case in ET.parse(f"{out}/fix_entries.xml").iter("testcase"):
    result = "FAILED" if case.find("failure") is not None or case.find("error") is not None \
        else "SKIPPED" if case.find("skipped") is not None else "PASSED"
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    rows.append(f"| {case.get('name')} | {result} | {props.get('differing', 'n/a')} |")
text = "\n".join([
    "# Fix-entry regression test on GPU (vllm#51632)", "",
    f"date: {datetime.date.today()} | GPU: {gpu} | vllm: {vllm.__version__} | "
    f"repo commit: {os.environ.get('GIT_COMMIT', 'unknown')} | pytest exit: {rc}", "",
    "| test | result | output elements differing from the PyTorch reference |",
    "|---|---|---|", *rows, ""])
open(f"{out}/fix_entries.md", "w").write(text)
print(text)
PY
exit $rc
