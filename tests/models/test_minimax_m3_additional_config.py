"""--additional-config keys meant for another MiniMax-M3 integration are named, not dropped.

Seed 000's MXFP8 command passes ATOM's online_quant_config, which vLLM never reads. Both
flavors share vllm/models/minimax_m3/common/additional_config.py; the v0.26.0 flavor runs
this file too (Makefile TESTS_v0.26.0), and its model-class test checks that upstream's
model actually calls the check."""

import inspect
from types import SimpleNamespace

import pytest

from vllm.models.minimax_m3.common import additional_config as ac

SEED_000 = {"online_quant_config": {"global_quant_config": "ptpc_fp8",
                                    "exclude_layer": ["lm_head", "*block_sparse_moe"]}}


@pytest.fixture
def warnings_said(monkeypatch):
    said = []
    monkeypatch.setattr(ac.logger, "warning", lambda msg, *a: said.append(msg % a))
    return said


def test_atoms_online_quant_config_is_named_as_unread(warnings_said):
    qc = SimpleNamespace(get_name=lambda: "modelopt_mxfp8")
    cfg = SimpleNamespace(additional_config=SEED_000, quant_config=qc)
    assert ac.warn_unread_additional_config(cfg) == ["online_quant_config"]
    assert len(warnings_said) == 1
    said = warnings_said[0]
    assert "'online_quant_config'" in said and "ATOM" in said
    assert "(modelopt_mxfp8) is served" in said


@pytest.mark.parametrize("extra", [{}, {"some_platform_key": 1}, None, "not a dict"])
def test_other_additional_config_is_left_alone(warnings_said, extra):
    cfg = SimpleNamespace(additional_config=extra, quant_config=None)
    assert ac.warn_unread_additional_config(cfg) == []
    assert warnings_said == []


def test_unquantized_checkpoint_is_named_as_such(warnings_said):
    cfg = SimpleNamespace(additional_config=SEED_000, quant_config=None)
    assert ac.warn_unread_additional_config(cfg) == ["online_quant_config"]
    assert "(none) is served" in warnings_said[0]


def test_the_served_model_class_runs_the_check():
    """The class vLLM builds for MiniMax-M3 on this platform calls the check in its
    constructor (v0.23.0: the series' model; v0.26.0: upstream's, patched)."""
    from vllm.models import minimax_m3

    src = inspect.getsource(minimax_m3.MiniMaxM3SparseForCausalLM.__init__)
    assert "warn_unread_additional_config(vllm_config)" in src
