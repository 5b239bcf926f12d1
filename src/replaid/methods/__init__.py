"""The method registry: each method implements one small interface.

``build_model(vocab_size)``, ``train_loss(model, tokens, generator, ...) -> (loss, metrics)``,
``after_step(metrics)``, ``eval_bound(model, tokens, generator) -> per-sequence per-token nats``,
``state_dict()`` / ``load_state_dict()`` for method state (e.g. RePlaid's adaptive split).
"""
from __future__ import annotations

from replaid.config import METHOD_NAMES, ConfigError, RunConfig
from replaid.methods.ar import ARMethod
from replaid.methods.duo import DuoMethod
from replaid.methods.langflow import LangFlowMethod
from replaid.methods.mdlm import MDLMMethod
from replaid.methods.plaid import PlaidMethod
from replaid.methods.replaid import RePlaidMethod

METHODS = {"replaid": RePlaidMethod, "ar": ARMethod, "mdlm": MDLMMethod, "plaid": PlaidMethod, "duo": DuoMethod}
assert set(METHODS) == set(METHOD_NAMES), "keep replaid.config.METHOD_NAMES in step with METHODS"
EVAL_ONLY = {"langflow": LangFlowMethod}  # converted peer checkpoints (config.EVAL_ONLY_METHODS)


def get_method(cfg: RunConfig):
    if cfg.method in EVAL_ONLY:
        return EVAL_ONLY[cfg.method](cfg)
    if cfg.method not in METHODS:
        raise ConfigError(f"unknown method '{cfg.method}'; choose one of {', '.join(sorted(METHODS))}")
    return METHODS[cfg.method](cfg)
