"""Typed, validated run configuration (torchtitan style): one dataclass per concern.

Overrides come as ``section.key=value`` strings or a YAML file of the same nesting; an unknown
key or a value of the wrong type raises :class:`ConfigError` naming the key and the nearest
valid key. The resolved config is saved as JSON with every run and checkpoint.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from replaid import schema

# Declared ranges of numbers that reach a tensor (issue 38), shared by the CLI's argparse types, the
# sampling request's and the config's validation. float32 holds up to 3.4e38; a config float stays within
# +-FLOAT_LIMIT (and is 0 or at least 1/FLOAT_LIMIT in magnitude), and the options below within their
# meaningful range (outside it the float32 arithmetic over- or underflows: e.g. logits / 1e-300 are inf, a
# guidance term times 1e30 is inf, and every token id comes out 0).
FLOAT_LIMIT = 1e30
# logit temperature: 0 (greedy: the argmax of every draw) or in [1e-6, 1e6]. Below 1e-6 the draws are
# greedy to float32 precision (two logits 1e-4 apart already weigh e^100 : 1), so 0 says it exactly; above
# 1e6 the tempered logits are uniform to float32 precision.
TEMPERATURE_RANGE = (1e-6, 1e6)
SCORE_TEMPERATURE_RANGE = (1e-3, 1e3)  # Plaid's score temperature: eps_hat / tau; 1e-6 already overflows e_hat
GUIDANCE_SCALE_MAX = 1e4  # guidance w: beyond it the guidance term alone decides every token (1e30 overflows)
LR_MAX = 10.0  # learning rates (and weight decays) in [0, 10]: an Adam step of 1e300 overflows float32
# adaptive ODE solves (likelihood --solver dopri5) run in float64: a tolerance below ODE_TOL_MIN is rounding
# (float64 resolves 2.2e-16 relative; the error estimate sums several such roundings per step), and each
# solve stops with an error after MAX_SOLVER_STEPS steps (--max-solver-steps) instead of running for hours
ODE_TOL_MIN = 1e-12
MAX_SOLVER_STEPS = 1_000  # about 6000 drift evaluations: ~25x a default Heun solve (128 steps)


class ConfigError(ValueError):
    """A bad configuration key or value (one-line message naming the key and the fix)."""


class Section(Protocol):
    """A config section: a dataclass that checks its own values."""

    def validate(self) -> None: ...


@dataclass
class ModelConfig:
    hidden: int = 768  # transformer width
    n_layers: int = 12
    n_heads: int = 12
    mlp_ratio: int = 4
    cond_dim: int = 128  # AdaLN conditioning width (MDLM)
    d_e: int = 16  # token-embedding dimension (RePlaid: 16)
    dropout: float = 0.0
    self_conditioning: bool = True
    output_prior: bool = True  # add (alpha / sigma^2) z E^T to the logits
    # embeddings: learned | frozen-random | one-hot | file (frozen, read from embeddings_path)
    embeddings: str = "learned"
    embeddings_path: str = ""
    # the embedding-exchange ablation (appendix "Exchanging Embedding Configurations"):
    normalize_embeddings: bool = True  # RePlaid: unit-norm rows; false: raw rows (MDLM's convention)
    up_projection: bool = True  # RePlaid: bias-free linear d_e -> hidden; false: identity (needs d_e == hidden)
    factored_embedding: bool = False  # AR/MDLM/Duo: d_e-dim rows (normalize_embeddings) + bias-free up-projection
    activation_checkpointing: bool = False
    # RePlaid's fused training head (model/head.py) turns its one (B*L, V) float32 logits buffer into
    # softmax and gradient this many rows of the flattened B*L at a time (0 = about 4M elements per chunk)
    head_chunk_rows: int = 0
    # time features of the time-conditioned token DiT (Duo, MDLM): plaid (sin/cos of t, 64) | dit
    # (MDLM/Duo's TimestepEmbedder: cos/sin of sigma = -log(1 - t), 256; used by converted checkpoints)
    time_embedding: str = "plaid"
    # RePlaid's input projection W_z init std: > 0 as given; 0 = auto, Plaid's (PyTorch's default-init std
    # 1/sqrt(3 d_e)) times min(1, hidden / 768); -1 = 1/sqrt(d_e) (unit-variance h_0, runs before 2026-11-24)
    in_z_std: float = 0.0
    # RePlaid's AdaLN condition: plaid (MLP of the 64 Plaid sin/cos features of gamma) | dit (MLP of the
    # DiT TimestepEmbedder's 256 features of gamma, frequencies <= 1) | none (a constant condition)
    adaln_features: str = "plaid"
    time_input: bool = True  # RePlaid: time features also added through the zero-initialised projection in_t
    readout_mult: float = 1.0  # RePlaid: features times this before the logit head (Plaid's muP: 256 / hidden)

    def validate(self) -> None:
        _check(
            self.hidden % self.n_heads == 0,
            "model.hidden",
            f"must be divisible by model.n_heads ({self.hidden} % {self.n_heads} != 0)",
        )
        _check(
            (self.hidden // self.n_heads) % 2 == 0,
            "model.hidden",
            "hidden / n_heads must be even for rotary embeddings",
        )
        for k in ("hidden", "n_layers", "n_heads", "mlp_ratio", "cond_dim", "d_e"):
            _check(getattr(self, k) > 0, f"model.{k}", "must be positive")
        _check(0.0 <= self.dropout < 1.0, "model.dropout", "must be in [0, 1)")
        _check(
            self.embeddings in ("learned", "frozen-random", "one-hot", "file"),
            "model.embeddings",
            "must be one of learned, frozen-random, one-hot, file",
        )
        _check(
            self.embeddings != "file" or bool(self.embeddings_path),
            "model.embeddings_path",
            "is required when model.embeddings=file",
        )
        _check(
            self.embeddings == "file" or not self.embeddings_path,
            "model.embeddings_path",
            f"is read only with model.embeddings=file (here {self.embeddings}); set model.embeddings=file "
            f"to start from that matrix, or drop model.embeddings_path",
        )
        _check(self.head_chunk_rows >= 0, "model.head_chunk_rows", "must be >= 0")
        _check(
            self.up_projection or (self.d_e == self.hidden and self.embeddings != "one-hot"),
            "model.up_projection",
            f"false needs model.d_e == model.hidden ({self.d_e} != {self.hidden}); set model.d_e={self.hidden}",
        )
        _check(self.time_embedding in ("plaid", "dit"), "model.time_embedding", "must be plaid or dit")
        _check(self.in_z_std >= 0 or self.in_z_std == -1, "model.in_z_std", "must be >= 0 (0 = auto) or -1 (legacy)")
        _check(self.adaln_features in ("plaid", "dit", "none"), "model.adaln_features", "must be plaid, dit or none")
        _check(self.readout_mult > 0, "model.readout_mult", "must be > 0")


@dataclass
class DiffusionConfig:
    gamma_0: float = -3.0  # initial endpoint gamma(0) (learnable)
    gamma_1: float = 6.0  # initial endpoint gamma(1) (learnable)
    schedule: str = "learned"  # learned (monotone MLP shape) | linear (fixed shape, endpoints learned)
    schedule_hidden: int = 1024  # monotone-MLP width
    learn_endpoints: bool = True
    sc_rate: float = 0.25  # fraction of training rows with a self-conditioning first pass
    split_ema: float = 0.997  # EMA decay of the recon/diffusion loss moments (adaptive B_r)
    ce_weight: float = 0.0  # paper sec. 5.1: + w * CE(t); gradient reaches only E and the denoiser
    prior_ramp_steps: int = 0  # Plaid: output-prior scale ramps 0 -> 1 over these training steps (0 = off)

    def validate(self) -> None:
        _check(self.gamma_0 < self.gamma_1, "diffusion.gamma_0", "must be smaller than diffusion.gamma_1")
        _check(self.schedule in ("learned", "linear"), "diffusion.schedule", "must be learned or linear")
        _check(0.0 <= self.sc_rate <= 1.0, "diffusion.sc_rate", "must be in [0, 1]")
        _check(0.0 < self.split_ema < 1.0, "diffusion.split_ema", "must be in (0, 1)")
        _check(self.schedule_hidden > 0, "diffusion.schedule_hidden", "must be positive")
        _check(self.ce_weight >= 0, "diffusion.ce_weight", "must be >= 0")
        _check(self.prior_ramp_steps >= 0, "diffusion.prior_ramp_steps", "must be >= 0")


@dataclass
class DataConfig:
    # "stdlib" (embedded default: Python standard-library docs), a local path (.jsonl/.txt/dir),
    # or "hf:NAME[:CONFIG]" (openwebtext, lm1b, slimpajama, wikitext, ...)
    source: str = "stdlib"
    tokenizer: str = "bpe"  # bpe | gpt2 | llama2 | bert-base-cased | bert-base-uncased
    tokenizer_path: str = ""
    bpe_vocab_size: int = 2048
    seq_len: int = 128
    packing: bool = True  # MDLM "wrap"; False: one document per row, padded, masked
    text_field: str = "text"
    max_docs: int = 0  # 0 = all documents
    cache_dir: str = "~/.cache/replaid"

    def validate(self) -> None:
        _check(bool(self.source), "data.source", "must be set (stdlib, a path, or hf:NAME)")
        _check(self.seq_len > 1, "data.seq_len", "must be > 1")
        _check(self.bpe_vocab_size >= 260, "data.bpe_vocab_size", "must be >= 260 (256 bytes + specials)")
        _check(self.max_docs >= 0, "data.max_docs", "must be >= 0")


@dataclass
class OptimConfig:
    lr_schedule: str = "constant"  # constant (linear warm-up) | cosine (to lr_min)
    warmup_steps: int = 2500  # used when warmup_frac == 0
    warmup_frac: float = 0.0  # e.g. 0.01 for "1% warm-up"
    min_warmup_steps: int = 0
    lr_min: float = 2e-5  # end of the cosine decay, all groups
    # the paper's parameter groups
    lr_backbone: float = 3e-4
    lr_projections: float = 3e-4  # the three input projections (z, self-cond, time)
    lr_embedding: float = 1e-2
    lr_schedule_mlp: float = 1e-2
    lr_endpoints: float = 1e-2
    wd_backbone: float = 0.0
    wd_projections: float = 0.0
    wd_embedding: float = 0.0
    wd_schedule_mlp: float = 0.0
    wd_endpoints: float = 0.1
    # Plaid's muP table: norms, output norm and output head apart from the backbone matrices (-1 = as backbone)
    lr_norms_head: float = -1.0
    wd_norms_head: float = -1.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0 = off
    ema: float = 0.9999  # EMA of weights for evaluation; 0 = off

    def validate(self) -> None:
        _check(self.lr_schedule in ("constant", "cosine"), "optim.lr_schedule", "must be constant or cosine")
        _check(0.0 <= self.ema < 1.0, "optim.ema", "must be in [0, 1)")
        _check(0.0 <= self.warmup_frac < 1.0, "optim.warmup_frac", "must be in [0, 1)")
        _check(self.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
        for k in ("lr_backbone", "lr_projections", "lr_embedding", "lr_schedule_mlp", "lr_endpoints"):
            _check(0 <= getattr(self, k) <= LR_MAX, f"optim.{k}", f"must be in [0, {LR_MAX:g}]")
        for k in ("wd_backbone", "wd_projections", "wd_embedding", "wd_schedule_mlp", "wd_endpoints"):
            _check(0 <= getattr(self, k) <= LR_MAX, f"optim.{k}", f"must be in [0, {LR_MAX:g}]")
        _check(self.grad_clip >= 0, "optim.grad_clip", "must be >= 0 (0 = off)")
        _check(self.eps > 0, "optim.eps", "must be > 0")
        _check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "optim.beta1", "beta1 and beta2 must be in [0, 1)")
        _check(
            self.lr_min >= 0 and self.min_warmup_steps >= 0, "optim.lr_min", "lr_min and min_warmup_steps must be >= 0"
        )
        _check(self.lr_min <= LR_MAX, "optim.lr_min", f"must be in [0, {LR_MAX:g}]")
        _check(1e-30 <= self.eps <= 1, "optim.eps", "must be in [1e-30, 1] (float32 holds it)")
        for k in ("lr_norms_head", "wd_norms_head"):
            _check(
                0 <= getattr(self, k) <= LR_MAX or getattr(self, k) == -1,
                f"optim.{k}",
                f"must be in [0, {LR_MAX:g}] or -1 (as backbone)",
            )


@dataclass
class TrainConfig:
    steps: int = 1000
    batch_size: int = 32  # global batch (sequences per optimiser step)
    grad_accum: int = 1
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: str = "auto"  # auto (bf16 autocast on GPU, fp32 on CPU) | fp32 | bf16
    compile: bool = False
    log_every: int = 10
    eval_every: int = 0  # 0 = only at the end
    save_every: int = 0  # 0 = only at the end
    num_threads: int = 0  # torch CPU threads; 0 = torch default
    parallel: str = "ddp"  # under torchrun: ddp | fsdp
    max_nonfinite_steps: int = 10  # stop after this many NaN/Inf steps in a row (each one is skipped)

    def validate(self) -> None:
        _check(self.steps > 0, "train.steps", "must be positive")
        _check(self.batch_size >= 1, "train.batch_size", "must be >= 1")
        _check(self.grad_accum >= 1, "train.grad_accum", "must be >= 1")
        _check(
            self.batch_size % self.grad_accum == 0,
            "train.batch_size",
            f"must be divisible by train.grad_accum ({self.grad_accum})",
        )
        _check(self.precision in ("auto", "fp32", "bf16"), "train.precision", "must be auto, fp32 or bf16")
        _check(self.parallel in ("ddp", "fsdp"), "train.parallel", "must be ddp or fsdp")
        _check(
            re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", self.device) is not None,
            "train.device",
            f"must be auto, cpu, cuda, cuda:N or mps, got {self.device!r}",
        )
        _check(self.log_every >= 1, "train.log_every", "must be >= 1")
        for k, zero in (
            ("eval_every", "only at the end"),
            ("save_every", "only at the end"),
            ("num_threads", "torch's default"),
        ):
            _check(getattr(self, k) >= 0, f"train.{k}", f"must be >= 0 (0 = {zero})")
        _check(self.max_nonfinite_steps >= 1, "train.max_nonfinite_steps", "must be >= 1")


@dataclass
class EvalConfig:
    split: str = "valid"
    max_batches: int = 8  # 0 = the whole split
    batch_size: int = 16
    t_samples: int = 4  # low-discrepancy diffusion-time samples per sequence
    self_conditioning: bool = True  # on for every row at evaluation
    use_ema: bool = True

    def validate(self) -> None:
        _check(self.split in ("train", "valid", "test"), "eval.split", "must be train, valid or test")
        _check(self.t_samples >= 1, "eval.t_samples", "must be >= 1")
        _check(self.batch_size >= 1, "eval.batch_size", "must be >= 1")
        _check(self.max_batches >= 0, "eval.max_batches", "must be >= 0")


def apply_cli(cfg: "RunConfig", flags: dict[str, tuple[str, Any]]) -> None:
    """Set ``{--flag: (section.key, value)}`` (None: not given) on ``cfg`` through the config's own
    typing and validation, so a command-line number is checked exactly as the same config key."""
    for flag, (key, value) in flags.items():
        if value is None:
            continue
        try:
            set_key(cfg, key, value)
            cfg.validate()
        except ConfigError as e:
            raise ConfigError(f"{flag} {value}: {e}") from None


# ------------------------------------------------------------------ per-method sections
# Each method's own settings live in its own section, validated only when that method runs; a key a
# user sets in another method's section (or a model key only another method reads) is refused, naming
# its method (refuse_foreign_keys).


@dataclass
class ARConfig:
    """``method=ar``."""

    top_p: float = 1.0  # nucleus sampling mass (1.0 = off)

    def validate(self) -> None:
        _check(0 < self.top_p <= 1, "ar.top_p", "must be in (0, 1]")


@dataclass
class MDLMConfig:
    """``method=mdlm``."""

    low_variance: bool = True  # train on plain masked CE (weight 1); evaluation always uses the NELBO
    time_conditioning: bool = False  # MDLM needs no time input (the mask count carries it)

    def validate(self) -> None:
        pass


@dataclass
class DuoConfig:
    """``method=duo``: the Gaussian curriculum (s-sahoo/duo configs/algo/duo.yaml; fractions of train.steps):
    active from step 0 to curriculum_end (0 = off), log10 tau ramps from start to end over [start, end]."""

    curriculum_start: float = 0.1
    curriculum_end: float = 0.2
    gamma_min: float = -3.5
    gamma_max: float = -1.75
    tau_log10_start: float = -1.0
    tau_log10_end: float = -2.0

    def validate(self) -> None:
        _check(
            0 <= self.curriculum_start <= self.curriculum_end <= 1,
            "duo.curriculum_start",
            "need 0 <= curriculum_start <= curriculum_end <= 1",
        )
        _check(self.gamma_min < self.gamma_max, "duo.gamma_min", "must be < duo.gamma_max")


@dataclass
class LangFlowConfig:
    """``method=langflow`` (converted checkpoints, evaluation only): LangFlow's Gumbel noise schedule."""

    gumbel_loc: float = 4.723
    gumbel_scale: float = 0.852
    gumbel_cutoff: float = 1e-5

    def validate(self) -> None:
        _check(self.gumbel_scale > 0, "langflow.gumbel_scale", "must be positive")
        _check(0 < self.gumbel_cutoff < 0.5, "langflow.gumbel_cutoff", "must be in (0, 0.5)")


# The methods of ``replaid.methods.METHODS`` (named here so the parser and config validation need no torch).
METHOD_NAMES = ("replaid", "plaid", "ar", "mdlm", "duo")
# Methods of converted peer checkpoints: evaluated and sampled, not trained (``replaid convert``).
EVAL_ONLY_METHODS = ("langflow",)
CONTINUOUS_METHODS = ("replaid", "plaid")  # trained on Algorithm 1 (the diffusion section)
# method sections and the methods that read them
SECTION_OWNERS: dict[str, tuple[str, ...]] = {
    "diffusion": CONTINUOUS_METHODS,
    "ar": ("ar",),
    "mdlm": ("mdlm",),
    "duo": ("duo",),
    "langflow": ("langflow",),
}
# model keys that only some methods' networks read (the others are every method's)
MODEL_KEY_OWNERS: dict[str, tuple[str, ...]] = {
    "self_conditioning": CONTINUOUS_METHODS + ("langflow",),
    **{
        k: CONTINUOUS_METHODS
        for k in ("output_prior", "embeddings", "embeddings_path", "up_projection", "head_chunk_rows")
    },
    **{k: ("ar", "mdlm", "duo") for k in ("factored_embedding", "time_embedding")},
    **{k: ("replaid",) for k in ("in_z_std", "adaln_features", "time_input", "readout_mult")},
}


@dataclass
class RunConfig:
    method: str = "replaid"
    preset: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)  # replaid, plaid
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    ar: ARConfig = field(default_factory=ARConfig)
    mdlm: MDLMConfig = field(default_factory=MDLMConfig)
    duo: DuoConfig = field(default_factory=DuoConfig)
    langflow: LangFlowConfig = field(default_factory=LangFlowConfig)

    def validate(self) -> "RunConfig":
        _check(
            self.method in METHOD_NAMES + EVAL_ONLY_METHODS,
            "method",
            f"unknown method {self.method!r}; choose one of " + ", ".join(METHOD_NAMES),
        )
        for f in dataclasses.fields(self):
            v: Section = getattr(self, f.name)
            if not dataclasses.is_dataclass(v) or self.method not in SECTION_OWNERS.get(f.name, (self.method,)):
                continue  # another method's section: not used, not validated
            for g in dataclasses.fields(v):  # NaN passes no comparison, inf passes ">= 0": refuse both
                x = getattr(v, g.name)
                _check(
                    not isinstance(x, float) or math.isfinite(x),
                    f"{f.name}.{g.name}",
                    f"must be a finite number, got {x}",
                )
            v.validate()  # its own ranges first, then the one every float has
            for g in dataclasses.fields(v):  # every float reaches a float32 tensor or multiplies one
                x = getattr(v, g.name)
                if isinstance(x, float) and not (x == 0 or 1 / FLOAT_LIMIT <= abs(x) <= FLOAT_LIMIT):
                    raise ConfigError(
                        f"invalid config value {f.name}.{g.name}: {x:g} is beyond the range float32 computes in; "
                        f"give 0 or a magnitude in [{1 / FLOAT_LIMIT:g}, {FLOAT_LIMIT:g}]"
                    )
        if self.method in CONTINUOUS_METHODS:  # Algorithm 1 needs a reconstruction row and a diffusion row
            micro = self.train.batch_size // self.train.grad_accum
            _check(
                micro >= 2,
                "train.batch_size",
                f"method={self.method} needs micro-batches of at least 2 rows "
                f"(one reconstruction row, one diffusion row); batch_size {self.train.batch_size} / grad_accum "
                f"{self.train.grad_accum} gives {micro}: raise train.batch_size or lower train.grad_accum",
            )
        return self

    def to_dict(self) -> dict:
        """Every key this run's method reads (other methods' sections and model keys are left out)."""
        d = dataclasses.asdict(self)
        for sec, owners in SECTION_OWNERS.items():
            if self.method not in owners:
                d.pop(sec)
        for k, owners in MODEL_KEY_OWNERS.items():
            if self.method not in owners:
                d["model"].pop(k)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        """A config from its dict (a run's config.json, a checkpoint's state.json), migrated first."""
        cfg = cls()
        apply_dict(cfg, migrate_config(d))
        return cfg.validate()


def read_run_config(path: str | Path, fix: str = "restore it, or start the run again with --overwrite") -> RunConfig:
    """A run's ``config.json`` (or a grid's ``configs/ID.json``), read and validated: one
    :class:`ConfigError` naming the file and the key otherwise."""
    try:
        d = schema.read_json(path, None, fix)
        cfg = RunConfig.from_dict(d)
        _strings_are_strings(migrate_config(d), cfg.to_dict(), "")
        return cfg
    except schema.SchemaError as e:
        raise ConfigError(str(e)) from None
    except ConfigError as e:
        raise ConfigError(f"{path} is not a valid run config ({e}); {fix}") from None


def _strings_are_strings(raw: dict, read: dict, prefix: str) -> None:
    """A JSON file states its strings as strings: a number read into a string key is refused (a YAML
    file or an override may still spell ``data.source=5``)."""
    for k, v in raw.items():
        if isinstance(v, dict) and isinstance(read.get(k), dict):
            _strings_are_strings(v, read[k], f"{prefix}{k}.")
        elif isinstance(read.get(k), str) and not isinstance(v, str):
            raise ConfigError(f"config key {prefix}{k} expects a string, got {v!r}")


def owners_of(key: str) -> tuple[str, ...] | None:
    """The methods that read config key ``section.key`` (None: every method)."""
    sec, _, name = key.partition(".")
    if sec == "model":
        return MODEL_KEY_OWNERS.get(name)
    return SECTION_OWNERS.get(sec)


def refuse_foreign_keys(cfg: RunConfig, keys: list[str]) -> None:
    """Refuse (one line naming the method it belongs to) any of the keys a user set (``key=value``
    overrides, a YAML file) that ``cfg.method`` never reads: it would be accepted without effect."""
    for key in keys:
        owners = owners_of(LEGACY_KEYS.get(key, key))
        if owners is not None and cfg.method not in owners:
            raise ConfigError(
                f"config key {key} belongs to method {'/'.join(owners)}, but this run is "
                f"method={cfg.method}: drop it (or set method={owners[0]})"
            )


def flat_keys(d: dict, prefix: str = "") -> list[str]:
    """``section.key`` of every leaf of a nested mapping (a YAML config file)."""
    out = []
    for k, v in d.items():
        out += flat_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]
    return out


# Keys of configs written before the per-method sections (issue 23): old key -> new key.
LEGACY_KEYS: dict[str, str] = {
    "baseline.mdlm_low_variance": "mdlm.low_variance",
    "baseline.mdlm_time_conditioning": "mdlm.time_conditioning",
    "baseline.ar_top_p": "ar.top_p",
    **{
        f"baseline.duo_{k}": f"duo.{k}"
        for k in ("curriculum_start", "curriculum_end", "gamma_min", "gamma_max", "tau_log10_start", "tau_log10_end")
    },
    **{f"baseline.langflow_gumbel_{k}": f"langflow.gumbel_{k}" for k in ("loc", "scale", "cutoff")},
}


def migrate_config(d: dict) -> dict:
    """A stored config (any version) in today's layout; the input is not modified.

    A RePlaid config without ``model.in_z_std`` was written when ``W_z`` started at std ``1/sqrt(d_e)``:
    it gets ``-1``, which keeps that init. Before the per-method sections every run stored every method's options in one flat ``baseline``
    section: each key moves to its method's section (:data:`LEGACY_KEYS`). Keys of sections and model
    keys that the run's method never read are reset to their defaults (they had no effect), so an
    old run keeps loading under the foreign-key check."""
    if not isinstance(d, dict):
        return d
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in d.items()}
    model = out.get("model")
    if out.get("method", "replaid") == "replaid" and isinstance(model, dict) and "in_z_std" not in model:
        model["in_z_std"] = -1.0  # written before model.in_z_std: W_z was initialised with std 1/sqrt(d_e)
    old = out.pop("baseline", None)
    if isinstance(old, dict):
        for k, v in old.items():
            new = LEGACY_KEYS.get(f"baseline.{k}")
            if new is None:
                raise ConfigError(f"unknown config key 'baseline.{k}' in a stored config; it is from another version")
            sec, key = new.split(".")
            out.setdefault(sec, {})[key] = v
        method = out.get("method", "replaid")
        for sec, owners in SECTION_OWNERS.items():
            if method not in owners:
                out.pop(sec, None)
        model = out.get("model")
        if isinstance(model, dict):
            for k, owners in MODEL_KEY_OWNERS.items():
                if method not in owners:
                    model.pop(k, None)
    return out


def _check(ok: bool, key: str, msg: str) -> None:
    if not ok:
        raise ConfigError(f"invalid config value {key}: {msg}")


# --------------------------------------------------------------------------- overrides


def _all_keys(obj: Any, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        name = prefix + f.name
        if dataclasses.is_dataclass(v):
            keys += _all_keys(v, name + ".")
        else:
            keys.append(name)
    return keys


def _unknown(key: str, root: Any) -> ConfigError:
    near = difflib.get_close_matches(key, _all_keys(root), n=1, cutoff=0.5)
    hint = f"; did you mean '{near[0]}'?" if near else "; run 'replaid train --show-config' for the valid keys"
    return ConfigError(f"unknown config key '{key}'{hint}")


def _coerce(key: str, value: Any, typ: Any) -> Any:
    """Convert a string/YAML value to the field's declared type, or raise a ConfigError."""
    if typ in ("int", int):
        typ = int
    elif typ in ("float", float):
        typ = float
    elif typ in ("bool", bool):
        typ = bool
    elif typ in ("str", str):
        typ = str
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"config key {key} expects a bool (true/false), got {value!r}")
    if typ is int:
        if isinstance(value, bool):
            raise ConfigError(f"config key {key} expects a whole number, got {value!r}")
        v: Any = value
        if isinstance(value, str):  # digits exactly; 1e3-style only where a float holds it exactly
            try:
                v = int(value.strip(), 10)
            except ValueError:
                try:
                    v = float(value)
                except ValueError:
                    v = None
        if isinstance(v, float) and v.is_integer() and abs(v) <= 2**53:
            v = int(v)
        if isinstance(v, int) and not isinstance(v, bool):
            if abs(v) >= 2**63:
                raise ConfigError(f"config key {key} = {str(value)[:30]} is out of range; use a number below 2**63")
            return v
        raise ConfigError(f"config key {key} expects a whole number, got {str(value)[:40]!r}")
    if typ is float:
        if isinstance(value, bool):
            raise ConfigError(f"config key {key} expects a float, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"config key {key} expects a float, got {str(value)[:40]!r}") from None
    if typ is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"config key {key} expects a string, got {value!r}")
        return str(value)
    raise ConfigError(f"config key {key} has an unsupported type {typ}")


def set_key(cfg: RunConfig, key: str, value: Any) -> None:
    """Set ``section.key`` on ``cfg`` with type checking (keys of older versions, :data:`LEGACY_KEYS`, too)."""
    key = LEGACY_KEYS.get(key, key)
    parts = key.split(".")
    obj: Any = cfg
    for i, p in enumerate(parts):
        names = {f.name: f for f in dataclasses.fields(obj)}
        if p not in names:
            raise _unknown(key, cfg)
        if i == len(parts) - 1:
            sub = getattr(obj, p)
            if dataclasses.is_dataclass(sub):
                if not isinstance(value, dict):
                    raise ConfigError(
                        f"config key {key} is a section; set one of its keys, e.g. {key}.{dataclasses.fields(sub)[0].name}=..."
                    )
                apply_dict(sub, value, prefix=key + ".", root=cfg)
                return
            hints = typing.get_type_hints(type(obj))
            setattr(obj, p, _coerce(key, value, hints[p]))
        else:
            obj = getattr(obj, p)
            if not dataclasses.is_dataclass(obj):
                raise _unknown(key, cfg)


def apply_dict(obj: Any, d: dict, prefix: str = "", root: Any = None) -> None:
    root = root if root is not None else obj
    if not isinstance(d, dict):
        raise ConfigError(f"config section {prefix or '<root>'} must be a mapping, got {type(d).__name__}")
    for k, v in d.items():
        full = prefix + str(k)
        names = {f.name for f in dataclasses.fields(obj)}
        if k not in names:
            raise _unknown(full, root)
        sub = getattr(obj, k)
        if dataclasses.is_dataclass(sub):
            apply_dict(sub, v, prefix=full + ".", root=root)
        else:
            hints = typing.get_type_hints(type(obj))
            setattr(obj, k, _coerce(full, v, hints[k]))


def parse_overrides(items: list[str]) -> list[tuple[str, str]]:
    out = []
    for it in items:
        if "=" not in it:
            raise ConfigError(f"override {it!r} is not of the form section.key=value (e.g. train.steps=100)")
        k, v = it.split("=", 1)
        out.append((k.strip(), v.strip()))
    return out


def load_yaml(path: str | Path) -> dict:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist; pass an existing YAML file to --config")
    try:
        d = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {p} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {p} is not valid YAML ({str(e).splitlines()[0]}); fix its syntax") from None
    if not isinstance(d, dict):
        raise ConfigError(f"config file {p} must hold a mapping of sections (model:, train:, ...)")
    return d
