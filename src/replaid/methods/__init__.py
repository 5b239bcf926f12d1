"""The method registry: each method implements one small interface.

``build_model(vocab_size)``, ``train_loss(model, tokens, generator, ...) -> (loss, metrics)``,
``after_step(metrics)``, ``eval_bound(model, tokens, generator) -> per-sequence per-token nats``,
``state_dict()`` / ``load_state_dict()`` for method state (e.g. RePlaid's adaptive split).
"""
from __future__ import annotations

from ..config import ConfigError, RunConfig
from .ar import ARMethod
from .duo import DuoMethod
from .mdlm import MDLMMethod
from .plaid import PlaidMethod
from .replaid import RePlaidMethod

METHODS = {"replaid": RePlaidMethod, "ar": ARMethod, "mdlm": MDLMMethod, "plaid": PlaidMethod, "duo": DuoMethod}


def get_method(cfg: RunConfig):
    if cfg.method not in METHODS:
        raise ConfigError(f"unknown method '{cfg.method}'; choose one of {', '.join(sorted(METHODS))}")
    return METHODS[cfg.method](cfg)
