"""The model routes SGLang 0.5.23 answers and clients read: ``/model_info`` (``/get_model_info``),
``/v1/models``, ``/v1/models/{id}`` and ``/ready``, in SGLang's shapes (``entrypoints/http_server.py``).
"""

from __future__ import annotations

from typing import Any

from draftlab.serving.server_state import HTTPFailure, ServerState


def model_info(state: ServerState) -> dict[str, Any]:
    config = state.engine.target.config
    return {"model_path": state.model_path, "served_model_name": state.model_path,
            "tokenizer_path": state.model_path if state.tokenizer is not None else None, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": state.weight_version, "load_format": "auto",
            "reasoning_parser": None, "tool_call_parser": None, "disaggregation_mode": "null",
            "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": getattr(config, "model_type", None), "architectures": getattr(config, "architectures", None)}


def _card(state: ServerState) -> dict[str, Any]:
    return {"id": state.model_path, "object": "model", "created": int(state.started), "owned_by": "sglang",
            "root": state.model_path, "max_model_len": state.engine.context_length}


def models(state: ServerState) -> dict[str, Any]:
    return {"object": "list", "data": [_card(state)]}


def model_card(state: ServerState, model: str) -> dict[str, Any]:
    """``/v1/models/{model}``: the served model's card; any other name is SGLang's 404."""
    if model != state.model_path:
        raise HTTPFailure(f"The model '{model}' does not exist", 404)
    return _card(state)


def ready(state: ServerState) -> bool:
    """``/ready``: whether new requests are taken (not while shutting down)."""
    return not state.stopping.is_set()
