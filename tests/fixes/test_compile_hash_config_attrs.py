"""Regression test for the series entry "[Bugfix][torch.compile] Hash
undeclared config attributes in the compile cache key".

transformers >= 5 makes every PretrainedConfig a dataclass. vLLM v0.23.0's
``normalize_value`` (the canonical form its config hashes use) takes the
dataclass branch first and hashes declared fields only, so an attribute the
class does not declare -- a key of config.json, or one set with
``--hf-overrides`` -- never reaches ``ModelConfig.compute_hash`` and hence the
torch.compile / AOT cache key. Found on the H200: an engine with
``hf_overrides={"fuse_shared_expert": true}`` loaded the compiled graph of the
same checkpoint without the option and failed with ``KeyError:
'shared_experts'``. With the entry those attributes change the key.

CPU only; the ``base`` variant reproduces v0.23.0's dataclass-first order to
show that the comparison detects the bug.
"""

import dataclasses

import pytest

# transformers and vllm are imported inside the tests, not at collection: both
# import triton.language, whose own @jit functions (tl.max, ...) must be made
# after tests/kernels/conftest.py sets TRITON_INTERPRET (collected later).


def normalize_value(x):
    from vllm.config.utils import normalize_value as entry

    return entry(x)


def _normalize_base(x):
    """v0.23.0's order: a dataclass is hashed by its declared fields."""
    if dataclasses.is_dataclass(x):
        return tuple((f.name, repr(getattr(x, f.name))) for f in dataclasses.fields(x))
    return normalize_value(x)


def _config(**extra):
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    for k, v in extra.items():
        setattr(cfg, k, v)
    return cfg


def test_transformers_configs_are_dataclasses():
    # the premise of the bug; if transformers drops dataclass configs this
    # entry can be revisited
    assert dataclasses.is_dataclass(_config())


@pytest.mark.parametrize("variant", ["entry", "base"])
def test_undeclared_attribute_changes_the_canonical_form(variant):
    norm = normalize_value if variant == "entry" else _normalize_base
    plain, a, a2, b = (_config(), _config(fuse_shared_expert=True),
                       _config(fuse_shared_expert=True), _config(fuse_shared_expert=False))
    assert norm(a) == norm(a2)  # stable for equal configs
    differs = norm(plain) != norm(a) and norm(a) != norm(b)
    assert differs == (variant == "entry")


def test_declared_field_still_changes_the_canonical_form():
    assert normalize_value(_config()) != normalize_value(_config(num_hidden_layers=3))


def test_hf_overrides_change_the_model_config_hash(tmp_path):
    """End to end through ModelConfig on a tiny MiniMax-M3 checkpoint: both
    model options passed with --hf-overrides change compute_hash()."""
    pytest.importorskip("transformers.models.minimax_m3_vl")
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
    from minimax_m3_utils import build_checkpoint

    from vllm.config import ModelConfig

    ckpt = build_checkpoint(str(tmp_path / "ckpt"))

    def key(overrides):
        return ModelConfig(model=ckpt, hf_overrides=overrides,
                           skip_tokenizer_init=True).compute_hash()

    base = key({})
    assert key({}) == base
    fused = key({"fuse_shared_expert": True})
    pth = key({"msa_kv_cache_scales": "per_token_head"})
    assert len({base, fused, pth}) == 3
