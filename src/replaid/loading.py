"""Load a trained run (config + tokenizer + weights) for evaluation and sampling."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from replaid.training import checkpoint as ck
from replaid.config import ConfigError, RunConfig
from replaid.methods import get_method
from replaid.data.pipeline import DataPipeline
from replaid.training.train import resolve_device


@dataclass
class Run:
    cfg: RunConfig
    model: torch.nn.Module
    method: object
    data: DataPipeline
    ckpt: Path
    step: int
    ema_loaded: bool

    @property
    def tokenizer(self):
        return self.data.tokenizer


def run_dir_of(ckpt: Path) -> Path:
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt


def load_run(path: str | Path, use_ema: bool = True, train_data: bool = False, device: str = "auto") -> Run:
    """``path``: a run or checkpoint directory, a folder made by ``replaid export``, or a Hub id."""
    from replaid.hub import resolve

    ckpt = ck.find_checkpoint(resolve(path))
    st = ck.load_state(ckpt, need=("step", "config", "vocab_size"))
    try:
        cfg = RunConfig.from_dict(st["config"])
    except ConfigError as e:
        raise ck.CheckpointError(f"checkpoint {ckpt} carries an invalid config ({e}); it is from another version") from None
    cfg.train.device = device if device != "auto" else cfg.train.device
    dev = resolve_device(cfg.train.device if cfg.train.device != "auto" else "auto")
    data = DataPipeline(cfg, run_dir_of(ckpt), train=train_data)
    if data.vocab_size != st["vocab_size"]:
        raise ck.CheckpointError(f"checkpoint {ckpt} was trained with vocab size {st['vocab_size']} but its "
                                 f"tokenizer now has {data.vocab_size}; restore the run's tokenizer/ folder")
    method = get_method(cfg)
    model = method.build_model(st["vocab_size"])
    weights = ck.load_tensors(ckpt, "ema") if use_ema else None
    ema_loaded = weights is not None or st.get("weights") == "ema"  # exported folders say which
    if weights is None:
        weights = ck.load_tensors(ckpt, "model")
    if weights is None:
        raise ck.CheckpointError(f"checkpoint {ckpt} has no model.safetensors; it is incomplete")
    bad = ck.nonfinite_tensor(weights)
    if bad is not None:
        raise ck.CheckpointError(f"checkpoint {ckpt} holds non-finite weights (NaN/Inf in {bad}); it comes from a "
                                 f"diverged run: use an earlier checkpoint or retrain with a smaller learning rate")
    ck.load_model_weights(model, weights, str(ckpt))
    if hasattr(method, "load_state_dict") and "method_state" in st:
        method.load_state_dict(st["method_state"])
    model.to(dev).eval()
    return Run(cfg, model, method, data, ckpt, int(st["step"]), ema_loaded)
