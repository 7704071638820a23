# SPDX-License-Identifier: Apache-2.0
"""``--additional-config`` keys that other MiniMax-M3 integrations read and vLLM does not.

Seed 000 serves MiniMax-M3-MXFP8 with ``--additional-config
'{"online_quant_config": {...ptpc_fp8...}}'``, a setting of the ATOM vLLM plugin (ROCm).
Without that plugin vLLM serves the checkpoint's own quantization and would drop the key
without a word; the model names it instead (one warning per key at model build)."""

from vllm.logger import init_logger

logger = init_logger(__name__)

# key -> who reads it
UNREAD_ADDITIONAL_CONFIG = {
    "online_quant_config": "the ATOM vLLM plugin (online re-quantization on ROCm)",
}


def warn_unread_additional_config(vllm_config) -> list[str]:
    """Warn about the ``--additional-config`` keys meant for another integration.

    Returns the keys warned about (empty when there are none)."""
    extra = getattr(vllm_config, "additional_config", None)
    if not isinstance(extra, dict):
        return []
    unread = [k for k in UNREAD_ADDITIONAL_CONFIG if k in extra]
    quant_config = getattr(vllm_config, "quant_config", None)
    quant = quant_config.get_name() if quant_config is not None else "none"
    for key in unread:
        logger.warning(
            "MiniMax-M3: --additional-config %r is read by %s, not by this model, and is "
            "ignored: the checkpoint's own quantization (%s) is served. Drop the key, or "
            "serve with that plugin installed.", key, UNREAD_ADDITIONAL_CONFIG[key], quant)
    return unread
