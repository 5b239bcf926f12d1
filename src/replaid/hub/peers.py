"""Converters from the official MDLM, Duo and LangFlow checkpoints to replaid folders (``replaid convert``).

Both peers use the DiT of MDLM's ``models/dit.py`` (Duo's is a copy): LayerNorm without bias,
``attn_qkv`` packed ``(three h d)``, rotary on halves (GPT-NeoX ``rotate_half``, base 10000), bias-free
attention projections, GELU(tanh) MLP with biases, AdaLN-Zero ``(shift, scale, gate) x 2`` per block and
``(shift, scale)`` before the head, conditioning ``c = silu(MLP(TimestepEmbedder(sigma)))`` with the
DiT's 256 ``[cos, sin]`` features of ``sigma``. That is :class:`replaid.model.tokens.TokenDiT` exactly:

* **MDLM** (``kuleshov-group/mdlm-owt``: ``config.json`` with ``hidden_dim/n_blocks/n_heads/cond_dim/
  vocab_size/model_length/time_conditioning`` and ``model.safetensors`` with keys ``backbone.*``).
  Vocabulary ``V + 1`` (``[MASK] = V``, GPT-2: 50257). The released model is not time-conditioned: it
  always sees ``sigma = 0``; replaid's MDLM keeps the AdaLN with that constant condition
  (``model.time_embedding=dit``, ``t = 0``), so the time MLP and AdaLN weights are copied as they are.
  The head's [MASK] row is dropped (SUBS gives it -inf). A time-conditioned MDLM is refused.
* **Duo** (``s-sahoo/duo``): the same keys with or without ``backbone.``; its config either in the
  Hub style above or as saved by its ``PyTorchModelHubMixin`` (``{"model": {...}, "vocab_size": V}``).
  Vocabulary ``V`` (no mask). Time-conditioned on ``sigma = -log(alpha_t)``: converted with
  ``model.time_embedding=dit`` (:class:`replaid.model.dit.DiTTimestepFeatures`), the AdaLN weights
  copied as they are. Duo evaluates with ``alpha_t = 1 - (1 - eps) t``; replaid's Duo conditions on
  ``t' = 1 - alpha_t`` directly, the same network input.

* **LangFlow** (its ``PreTrainedModel``, ``save_pretrained`` safetensors): an embedding-space VP model
  whose network is not RePlaid's (see ``replaid/model/langflow.py`` for every difference), converted by
  :func:`langflow_to_denoiser` to a :class:`~replaid.model.langflow.LangFlowDenoiser` on our DiT blocks:
  ``replaid convert langflow`` writes a folder of the evaluation-only method ``langflow``
  (``replaid/methods/langflow.py``): ``replaid eval`` (VDM NELBO under its Gumbel schedule),
  ``replaid sample``, ``replaid likelihood`` (ODE bound, ``--selfcond-correction on|off``), ``zeroshot``.

Verified against each peer's own code (tests/fixtures/peers, built from the peers' modelling files at
a tiny size with random weights; max |logit difference| in tests/test_peers.py).
Pickled checkpoints (``.bin``/``.ckpt``) are refused: loading never unpickles.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from replaid import presets
from replaid.config import RunConfig
from replaid.data.pipeline import DataPipeline
from replaid.hub.export import model_card, refuse_existing, write_folder
from replaid.methods import get_method
from replaid.model.langflow import LangFlowDenoiser
from replaid.store.checkpoint import CheckpointError, load_model_weights
from replaid.store.loading import resolve

PEERS = ("mdlm", "duo", "langflow")


def read_peer(folder: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config, tensors without the ``backbone.`` prefix) of a Hub-layout folder or Hub id."""
    d = resolve(folder)
    if not (d / "config.json").is_file():
        raise CheckpointError(f"{d} has no config.json; pass the peer's Hub folder (config.json + model.safetensors)")
    if not (d / "model.safetensors").is_file():
        raise CheckpointError(
            f"{d} has no model.safetensors (pickled .bin/.ckpt files are not read); use the Hub's safetensors revision"
        )
    try:
        cfg = json.loads((d / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"{d / 'config.json'} is not readable JSON ({e.__class__.__name__}); restore it"
        ) from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{d / 'config.json'} holds a {type(cfg).__name__}, not a config object; restore it")
    try:
        sd = load_file(str(d / "model.safetensors"))
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(
            f"{d / 'model.safetensors'} is not a readable safetensors file ({e.__class__.__name__}); download it again"
        ) from None
    return cfg, {k[len("backbone.") :] if k.startswith("backbone.") else k: v for k, v in sd.items()}


def dit_shape(cfg: dict[str, Any]) -> dict[str, Any]:
    """hidden, n_layers, n_heads, cond_dim, vocab (the network's rows), length, time_conditioning."""
    if "model" in cfg and isinstance(cfg["model"], dict):  # PyTorchModelHubMixin (hydra config) layout
        m = cfg["model"]
        return dict(
            hidden=m["hidden_size"],
            n_layers=m["n_blocks"],
            n_heads=m["n_heads"],
            cond_dim=m["cond_dim"],
            vocab=cfg["vocab_size"],
            length=m.get("length", 1024),
            time_conditioning=True,
        )
    try:
        return dict(
            hidden=cfg["hidden_dim"],
            n_layers=cfg["n_blocks"],
            n_heads=cfg["n_heads"],
            cond_dim=cfg["cond_dim"],
            vocab=cfg["vocab_size"],
            length=cfg.get("model_length", 1024),
            time_conditioning=bool(cfg.get("time_conditioning", False)),
        )
    except KeyError as e:
        raise CheckpointError(f"config.json lacks {e}; it is not an MDLM/Duo DiT config") from None


def _block(sd: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
    """Block ``i``'s weights under our names (norm biases zero: the peers' LayerNorm has none)."""
    p = f"blocks.{i}."
    out = {
        "qkv.weight": sd[p + "attn_qkv.weight"],
        "attn_out.weight": sd[p + "attn_out.weight"],
        "mlp.0.weight": sd[p + "mlp.0.weight"],
        "mlp.0.bias": sd[p + "mlp.0.bias"],
        "mlp.2.weight": sd[p + "mlp.2.weight"],
        "mlp.2.bias": sd[p + "mlp.2.bias"],
    }
    for n in ("norm1", "norm2"):
        out[f"{n}.weight"] = sd[p + f"{n}.weight"]
        out[f"{n}.bias"] = torch.zeros_like(sd[p + f"{n}.weight"])
    return out


def mdlm_to_tokendit(
    cfg: dict[str, Any], sd: dict[str, torch.Tensor]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(shape, our TokenDiT state dict) for a non-time-conditioned MDLM: our TokenDiT keeps MDLM's
    AdaLN and time MLP (``model.time_embedding=dit``; its constant condition is MDLM's sigma = 0),
    so they are copied as they are; the head's [MASK] row is dropped."""
    s = dit_shape(cfg)
    if s["time_conditioning"]:
        raise CheckpointError(
            "this MDLM checkpoint is time-conditioned; only the released sigma=0 models "
            "(time_conditioning=false, e.g. kuleshov-group/mdlm-owt) convert exactly"
        )
    V = s["vocab"] - 1  # [MASK] is the last input id
    _, out = duo_to_tokendit(cfg, sd)
    out["final.linear.weight"] = sd["output_layer.linear.weight"][:V]
    out["final.linear.bias"] = sd["output_layer.linear.bias"][:V]
    return {**s, "vocab": V}, out


def duo_to_tokendit(cfg: dict[str, Any], sd: dict[str, torch.Tensor]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(shape, our TokenDiT state dict) for Duo: AdaLN and the time MLP copied as they are."""
    s = dit_shape(cfg)
    out = {
        "embed.weight": sd["vocab_embed.embedding"],
        "cond.0.weight": sd["sigma_map.mlp.0.weight"],
        "cond.0.bias": sd["sigma_map.mlp.0.bias"],
        "cond.2.weight": sd["sigma_map.mlp.2.weight"],
        "cond.2.bias": sd["sigma_map.mlp.2.bias"],
    }
    out.update(adaln_blocks_and_head(sd, s["n_layers"]))
    return s, out


def adaln_blocks_and_head(sd: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """Blocks with their AdaLN and the AdaLN head, as they are (time-conditioned DiT: Duo, LangFlow)."""
    out = {}
    for i in range(n_layers):
        b = _block(sd, i)
        b["adaLN.weight"] = sd[f"blocks.{i}.adaLN_modulation.weight"]
        b["adaLN.bias"] = sd[f"blocks.{i}.adaLN_modulation.bias"]
        out.update({f"backbone.blocks.{i}.{k}": v for k, v in b.items()})
    out.update(
        {
            "final.norm.weight": sd["output_layer.norm_final.weight"],
            "final.norm.bias": torch.zeros_like(sd["output_layer.norm_final.weight"]),
            "final.linear.weight": sd["output_layer.linear.weight"],
            "final.linear.bias": sd["output_layer.linear.bias"],
            "final.adaLN.weight": sd["output_layer.adaLN_modulation.weight"],
            "final.adaLN.bias": sd["output_layer.adaLN_modulation.bias"],
        }
    )
    return out


def run_config(kind: str, shape: dict[str, Any], overrides: list[str]) -> RunConfig:
    """Our RunConfig for a converted peer (``overrides``: data.*, eval.* ... as ``key=value``)."""

    base = [
        f"method={kind}",
        f"model.hidden={shape['hidden']}",
        f"model.n_layers={shape['n_layers']}",
        f"model.n_heads={shape['n_heads']}",
        f"model.cond_dim={shape['cond_dim']}",
        "model.mlp_ratio=4",
        "model.dropout=0.0",
        f"data.seq_len={shape['length']}",
        "data.tokenizer=gpt2",
    ]
    base += {
        "mdlm": ["model.time_embedding=dit", "mdlm.time_conditioning=false"],
        "duo": ["model.time_embedding=dit"],
    }.get(kind, [])
    return presets.resolve("owt-0.1b", None, base + shape.get("extra", []) + list(overrides))


def convert(kind: str, src: str, out: str, overrides: list[str]) -> Path:
    """Convert a peer checkpoint into a replaid folder (same layout as ``replaid export``)."""

    if kind not in PEERS:
        raise CheckpointError(f"unknown peer '{kind}'; choose one of {', '.join(PEERS)}")
    refuse_existing(Path(out))
    if kind == "langflow":
        lf = langflow_to_denoiser(src)
        weights = {k: v.detach() for k, v in lf.state_dict().items()}
        sched = lf.schedule
        shape = dict(
            hidden=lf.hidden,
            n_layers=len(lf.backbone.blocks),
            n_heads=lf.backbone.blocks[0].n_heads,
            cond_dim=lf.cond[0].out_features,
            vocab=lf.vocab_size,
            length=read_peer(src)[0].get("model_length", 1024),
            extra=[
                f"model.self_conditioning={str(lf.self_conditioning).lower()}",
                f"langflow.gumbel_loc={sched.loc!r}",
                f"langflow.gumbel_scale={sched.scale!r}",
                f"langflow.gumbel_cutoff={sched.cutoff!r}",
            ],
        )
    else:
        cfg_in, sd = read_peer(src)
        try:
            shape, weights = (mdlm_to_tokendit if kind == "mdlm" else duo_to_tokendit)(cfg_in, sd)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            raise CheckpointError(
                f"{src} is not a complete {kind} checkpoint (config.json key or tensor {e} missing or "
                f"malformed: {e.__class__.__name__}); pass the peer's own Hub folder"
            ) from None
    cfg = run_config(kind, shape, overrides)
    data = DataPipeline(cfg, None, train=False)
    if data.vocab_size != shape["vocab"]:
        raise CheckpointError(
            f"{src} has vocabulary {shape['vocab']} but tokenizer {data.tokenizer.name} has "
            f"{data.vocab_size}; pass data.tokenizer=... data.tokenizer_path=... of the peer"
        )
    model = get_method(cfg).build_model(shape["vocab"])
    load_model_weights(model, weights, str(src))  # strict: every key and shape
    n = sum(p.numel() for p in model.parameters())
    cfg_d = cfg.to_dict()
    card = model_card(cfg_d, 0, "converted", n, {}, data.tokenizer.name).replace(
        "# ", f"# Converted from {src} ({kind}); ", 1
    )
    state = {
        "step": 0,
        "config": cfg_d,
        "vocab_size": shape["vocab"],
        "weights": "converted",
        "method_state": {},
        "converted_from": str(src),
    }
    return write_folder(Path(out), state, weights, data.tokenizer, card)


# ------------------------------------------------------------------ LangFlow


def langflow_to_denoiser(folder: str | Path) -> LangFlowDenoiser:
    """LangFlow's Hub folder (``LangFlowConfig`` + ``model.safetensors``) as a
    :class:`replaid.model.langflow.LangFlowDenoiser` with the same weights (strict)."""

    d = resolve(folder)
    cfg, sd = read_peer(d)  # config.json an object, model.safetensors readable (N04-N06)
    try:
        return _langflow_model(cfg, sd, d)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:  # N07: a key or tensor missing
        raise CheckpointError(
            f"{d} is not a complete LangFlow checkpoint (config.json key or tensor {e} missing or malformed: "
            f"{e.__class__.__name__}); pass LangFlow's own save_pretrained folder"
        ) from None


def _langflow_model(cfg: dict[str, Any], sd: dict[str, torch.Tensor], d: Path) -> LangFlowDenoiser:
    if (
        not cfg.get("use_normalized_embedding", True)
        or cfg.get("embedding_norm_method", "layernorm") != "layernorm"
        or not cfg.get("use_bias", True)
    ):
        raise CheckpointError(
            f"{d / 'config.json'}: only LangFlow's released configuration converts (normalised embeddings, use_bias)"
        )
    model = LangFlowDenoiser(
        cfg["vocab_size"],
        cfg["hidden_size"],
        cfg["n_blocks"],
        cfg["n_heads"],
        cfg["cond_dim"],
        cfg.get("self_conditioning", True),
        float(sd.get("proposal.loc", cfg["gumbel_loc"])),
        float(sd.get("proposal.scale", cfg["gumbel_scale"])),
        cfg["gumbel_cutoff"],
    )
    w = {
        "weight": sd["vocab_embed.embedding"],
        "cond.0.weight": sd["sigma_map.mlp.0.weight"],
        "cond.0.bias": sd["sigma_map.mlp.0.bias"],
        "cond.2.weight": sd["sigma_map.mlp.2.weight"],
        "cond.2.bias": sd["sigma_map.mlp.2.bias"],
    }
    if model.sc_proj is not None:
        w["sc_proj.weight"] = sd["self_cond_proj.weight"]
    w.update(adaln_blocks_and_head(sd, cfg["n_blocks"]))
    load_model_weights(model, w, str(d))
    return model.eval()
