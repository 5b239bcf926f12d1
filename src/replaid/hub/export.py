"""``replaid export``: a run as a folder in the Hugging Face Hub's conventions.

    DIR/config.json          transformers config: model_type "replaid", auto_map -> modeling_replaid.py,
                             plus the run's full replaid config (``replaid_config``), method and vocab size
    DIR/model.safetensors    the EMA weights (default) or the trained ones (``--raw``), our own key names
    DIR/state.json           what replaid's loader reads (step, config, vocab size, method state, weights)
    DIR/tokenizer/           the run's tokenizer, self-contained (tokenizer.json + spec)
    DIR/tokenizer.json, tokenizer_config.json   the same for ``transformers.AutoTokenizer``
    DIR/modeling_replaid.py  ``AutoModel.from_pretrained(DIR, trust_remote_code=True)`` (imports replaid)
    DIR/README.md            model card: YAML front matter + method, data, steps, evaluation figures

A folder is a complete checkpoint for every replaid command (``replaid eval DIR``). Upload it with
the Hub's own client, e.g. ``hf upload OWNER/NAME DIR`` or ``huggingface_hub.upload_folder``.
The folder is written into a temporary sibling and renamed into place; an existing non-empty
``--out`` is refused, never overwritten.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, cast

import torch
from safetensors.torch import save_file

from replaid import schema
from replaid.config import RunConfig
from replaid.data.tokenizers import SPEC_FILE, HFTokenizer, Tokenizer, tokenizer_files_sha256, vocab_sha256
from replaid.methods import Method, get_method, method_class
from replaid.schema import dumps as strict_dumps
from replaid.store import checkpoint as ck
from replaid.store.loading import load_run, resolve, run_dir_of

MODELING_FILE = "modeling_replaid.py"
HF_FIELDS = (
    "model_type",
    "architectures",
    "auto_map",
    "replaid_method",
    "replaid_config",
    "vocab_size",
    "replaid_step",
    "replaid_weights",
    "torch_dtype",
)


def hf_config(cfg_dict: dict[str, Any], vocab_size: int, step: int, weights: str) -> dict[str, Any]:
    """The ``config.json`` transformers reads (auto_map points at the bundled modeling file)."""
    m = cfg_dict["model"]
    return {
        "model_type": "replaid",
        "architectures": ["ReplaidModel"],
        "auto_map": {
            "AutoConfig": "modeling_replaid.ReplaidConfig",
            "AutoModel": "modeling_replaid.ReplaidModel",
            "AutoModelForMaskedLM": "modeling_replaid.ReplaidModel",
        },
        "replaid_method": cfg_dict["method"],
        "vocab_size": vocab_size,
        "hidden_size": m["hidden"],
        "num_hidden_layers": m["n_layers"],
        "num_attention_heads": m["n_heads"],
        "max_position_embeddings": cfg_dict["data"]["seq_len"],
        "replaid_step": step,
        "replaid_weights": weights,
        "replaid_config": cfg_dict,
        "torch_dtype": "float32",
    }


def build_from_hf_config(d: dict[str, Any]) -> tuple[torch.nn.Module, Method[Any]]:
    """(network, method) of the shape an exported ``config.json`` describes (fresh weights)."""
    cfg = RunConfig.from_dict(d["replaid_config"])
    method = get_method(cfg)
    return method.build_model(int(d["vocab_size"])), method


def last_eval(run_dir: Path) -> dict[str, Any]:
    """The last evaluation record of ``RUN/metrics.jsonl`` (keys without the ``eval/`` prefix)."""
    out: dict[str, Any] = {}
    for rec in schema.jsonl_rows(run_dir / "metrics.jsonl", schema.METRICS_ROW):
        ev = {k[5:]: v for k, v in rec.items() if k.startswith("eval/")}
        if ev:
            out = {"step": rec["step"], **ev}
    return out


def _copy_tokenizer(tok: Tokenizer, dst: Path, seq_len: int) -> None:
    """The run's tokenizer as a self-contained ``tokenizer/`` folder, plus transformers' files."""
    (dst / "tokenizer").mkdir()
    spec = {"kind": "file", "name": tok.name, "vocab_size": tok.vocab_size, "eos_id": tok.eos_id, "pad_id": tok.pad_id}
    if hasattr(tok, "to_json"):  # Hugging Face tokenizers: one tokenizer.json
        text = tok.to_json()
        (dst / "tokenizer" / "tokenizer.json").write_text(text, encoding="utf-8")
        (dst / "tokenizer.json").write_text(text, encoding="utf-8")
        spec["file"] = "tokenizer.json"
        eos = cast(HFTokenizer, tok)._tok.id_to_token(tok.eos_id)  # to_json: a Hugging Face tokenizer
        tc = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": eos,
            "bos_token": eos,
            "model_max_length": seq_len,
            "clean_up_tokenization_spaces": False,
        }
        if tok.pad_id is not None:
            tc["pad_token"] = cast(HFTokenizer, tok)._tok.id_to_token(tok.pad_id)
        (dst / "tokenizer_config.json").write_text(strict_dumps(tc, indent=2) + "\n")
    else:  # sentencepiece (llama2): keep the spec that names the model file
        spec = {
            "kind": getattr(tok, "kind", "llama2"),
            "name": tok.name,
            "vocab_size": tok.vocab_size,
            "eos_id": tok.eos_id,
            "pad_id": tok.pad_id,
            "path": getattr(tok, "path", ""),
        }
    (dst / "tokenizer" / SPEC_FILE).write_text(strict_dumps(spec, indent=2) + "\n")


def model_card(
    cfg: dict[str, Any],
    step: int,
    weights: str,
    n_params: int,
    ev: dict[str, Any],
    tok_name: str,
    repo_hint: str = "OWNER/NAME",
) -> str:
    d, m = cfg["data"], cfg["model"]
    tags = list(dict.fromkeys(["replaid", "diffusion-language-model", cfg["method"], "safetensors"]))
    src = d["source"]
    datasets = [src[3:].split(":")[0]] if src.startswith("hf:") else []
    front = ["---", "library_name: replaid", "license: mit", "pipeline_tag: fill-mask", "tags:"] + [
        f"- {t}" for t in tags
    ]
    if datasets:
        front += ["datasets:"] + [f"- {x}" for x in datasets]
    front += ["---", ""]
    what = method_class(cfg["method"]).description
    body = [
        f"# {cfg['method']} model exported by replaid",
        "",
        f"- method: {what}",
        f"- network: hidden {m['hidden']}, {m['n_layers']} layers, {m['n_heads']} heads ({n_params:,} parameters)",
        f"- data: `{src}`, tokenizer `{tok_name}`, sequence length {d['seq_len']}",
        f"- training: {step} steps (batch {cfg['train']['batch_size']}), weights: {weights}",
        "",
    ]
    if ev:
        body += ["## Evaluation (the run's last evaluation, from metrics.jsonl)", "", "| metric | value |", "|---|---|"]
        for k, v in ev.items():
            body.append(f"| {k} | {v:.6g} |" if isinstance(v, float) else f"| {k} | {v} |")
        body.append("")
    body += [
        "## Use",
        "",
        "```bash",
        "pip install replaid",
        f"replaid eval {repo_hint} --split valid     # or a local copy of this folder",
        f"replaid sample {repo_hint} --num 4 --steps 64",
        "```",
        "",
        "```python",
        "import replaid.hub",
        f'run = replaid.hub.from_pretrained("{repo_hint}")   # .model .method .tokenizer',
        "from transformers import AutoModel, AutoTokenizer",
        f'm = AutoModel.from_pretrained("{repo_hint}", trust_remote_code=True)  # m.net, m.method, m.tokenizer',
        f'tok = AutoTokenizer.from_pretrained("{repo_hint}", trust_remote_code=True)  # the same tokenizer',
        "```",
        "",
        "Upload: `hf upload OWNER/NAME THIS_FOLDER` (the Hub's own client).",
        "",
    ]
    return "\n".join(front + body)


def refuse_existing(out: Path) -> None:
    """Never overwrite: an existing non-empty ``--out`` is a one-line error."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ck.CheckpointError(f"--out {out} exists and is not empty; choose a new folder (nothing was written)")


def export_run(run: str | os.PathLike[str], out: str | os.PathLike[str], raw: bool = False) -> Path:
    """Write ``run``'s latest checkpoint as a Hub folder at ``out``; returns ``out``."""
    stored = ck.Stored.open(resolve(run), need=("step", "config", "vocab_size"))
    ckpt, st = stored.path, stored.state
    refuse_existing(Path(out))
    weights, from_ema = stored.weights(ema=not raw)
    kind = "ema" if from_ema else "raw"
    r = load_run(ckpt, use_ema=(kind == "ema"))  # validates config, tokenizer and shapes
    cfg = st["config"]
    n_params = sum(p.numel() for p in r.model.parameters())
    card = model_card(cfg, int(st["step"]), kind, n_params, last_eval(run_dir_of(ckpt)), r.tokenizer.name)
    state = {
        "step": int(st["step"]),
        "config": cfg,
        "vocab_size": st["vocab_size"],
        "weights": kind,
        "method_state": st.get("method_state", {}),
        "exported_from": str(ckpt.resolve()),
    }
    return write_folder(Path(out), state, weights, r.tokenizer, card)


def write_folder(
    out: Path, state: dict[str, Any], weights: dict[str, torch.Tensor], tokenizer: Tokenizer, card: str
) -> Path:
    """Write the folder atomically (temporary sibling, then rename); ``state`` as in ``state.json``."""
    out = Path(out)
    refuse_existing(out)
    cfg = state["config"]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_file(
            {k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"), metadata={"format": "pt"}
        )
        _copy_tokenizer(tokenizer, tmp, cfg["data"]["seq_len"])
        binding = {"files": tokenizer_files_sha256(tmp / "tokenizer"), "vocab_sha256": vocab_sha256(tokenizer)}
        state = {
            **state,
            "sha256": {"model.safetensors": ck.sha256_file(tmp / "model.safetensors")},
            "binding": {"tokenizer": binding},  # its own tokenizer/, checked by load_run
        }
        (tmp / "state.json").write_text(strict_dumps(state, indent=2) + "\n")
        (tmp / "config.json").write_text(
            strict_dumps(hf_config(cfg, state["vocab_size"], state["step"], state["weights"]), indent=2) + "\n"
        )
        shutil.copyfile(Path(__file__).with_name(MODELING_FILE), tmp / MODELING_FILE)
        (tmp / "README.md").write_text(card)
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
