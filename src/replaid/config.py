"""Typed, validated run configuration (torchtitan style): one dataclass per concern.

Overrides come as ``section.key=value`` strings or a YAML file of the same nesting; an unknown
key or a value of the wrong type raises :class:`ConfigError` naming the key and the nearest
valid key. The resolved config is saved as JSON with every run and checkpoint.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replaid import registry, schema
from replaid.registry import ConfigError as ConfigError  # the registry, below the config, raises it too
from replaid.schema import dumps as strict_dumps

# Declared ranges of numbers that reach a tensor, shared by the CLI's argparse types, the
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
MAX_STEPS = 100_000  # sampling / solver steps (T): beyond this a time grid alone is gigabytes


def range_problem(
    v: float,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
    or_zero: bool = False,
) -> str:
    """Why ``v`` is outside ``[lo, hi]`` (an open end excluded; ``or_zero``: 0 allowed as the option's special
    value), or "": the one range rule of every number a user gives (the CLI's flags, a sampling request's
    fields in the playground and the API)."""
    if isinstance(v, float) and not math.isfinite(v):
        return "must be a finite number"
    if or_zero and v == 0:
        return ""
    if lo is not None and (v < lo or (lo_open and v == lo)):
        return f"must be {'0 or ' if or_zero else ''}{'>' if lo_open else '>='} {_num(lo)}"
    if hi is not None and (v > hi or (hi_open and v == hi)):
        return f"must be {'<' if hi_open else '<='} {_num(hi)}"
    return ""


def _num(x: float) -> str:
    """A bound as a message writes it: a whole number exactly, a float in ``%g``."""
    return str(x) if isinstance(x, int) else f"{x:g}"


LR_MAX = 10.0  # learning rates (and weight decays) in [0, 10]: an Adam step of 1e300 overflows float32
# adaptive ODE solves (likelihood --solver dopri5) run in float64: a tolerance below ODE_TOL_MIN is rounding
# (float64 resolves 2.2e-16 relative; the error estimate sums several such roundings per step), and each
# solve stops with an error after MAX_SOLVER_STEPS steps (--max-solver-steps) instead of running for hours
ODE_TOL_MIN = 1e-12
MAX_SOLVER_STEPS = 1_000  # about 6000 drift evaluations: ~25x a default Heun solve (128 steps)


# The shared backbone: the model keys every method's network reads. A method's network may read more
# of ModelConfig's keys: it lists them in its ``Method.model_keys``; a key no one lists is refused.
BACKBONE_KEYS = (
    "hidden",
    "n_layers",
    "n_heads",
    "mlp_ratio",
    "cond_dim",
    "d_e",
    "dropout",
    "normalize_embeddings",
    "activation_checkpointing",
)


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
    # embeddings: learned | frozen-random | one-hot | file (frozen, read from embeddings_path) | init-file
    # (learned, starting from embeddings_path's matrix) | cooc (learned, starting from the train split's top
    # co-occurrence directions, replaid.data.cooc: the fast start off the unigram plateau)
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
            self.embeddings in ("learned", "frozen-random", "one-hot", "file", "init-file", "cooc"),
            "model.embeddings",
            "must be one of learned, frozen-random, one-hot, file, init-file, cooc",
        )
        _check(
            self.embeddings not in ("file", "init-file") or bool(self.embeddings_path),
            "model.embeddings_path",
            f"is required when model.embeddings={self.embeddings}",
        )
        _check(
            self.embeddings in ("file", "init-file") or not self.embeddings_path,
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
    compile: str = "auto"  # auto (on CUDA; eager on the CPU, where Inductor's build outweighs short runs) | on | off
    log_every: int = 10
    eval_every: int = 0  # 0 = only at the end
    save_every: int = 0  # 0 = only at the end
    num_threads: int = 0  # torch CPU threads; 0 = the cores free now (replaid.training.threads)
    parallel: str = "ddp"  # under torchrun: ddp | fsdp | hsdp (FSDP2 on a replicate x shard mesh)
    hsdp_shard: int = 0  # hsdp: ranks per shard group (0 = the ranks of one node, LOCAL_WORLD_SIZE)
    max_nonfinite_steps: int = 10  # stop after this many NaN/Inf steps in a row (each one is skipped)
    # plateau signatures on logging steps (training/signatures.py): rows of the step's batch probed, 0 = off
    signature_rows: int = 8
    logger: str = "tensorboard"  # trackers beside metrics.jsonl: tensorboard | wandb | tensorboard+wandb | none
    wandb_project: str = "replaid"  # the W&B project of train.logger=wandb (entity: WANDB_ENTITY or wandb's default)

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
        _check(
            self.compile in ("auto", "on", "off"),
            "train.compile",
            f"must be auto (compiled on CUDA, eager on the CPU), on or off, got {self.compile!r}",
        )
        _check(self.parallel in ("ddp", "fsdp", "hsdp"), "train.parallel", "must be ddp, fsdp or hsdp")
        _check(self.hsdp_shard >= 0, "train.hsdp_shard", "must be >= 0 (0 = the ranks of one node)")
        _check(
            re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", self.device) is not None,
            "train.device",
            f"must be auto, cpu, cuda, cuda:N or mps, got {self.device!r}",
        )
        _check(self.log_every >= 1, "train.log_every", "must be >= 1")
        for k, zero in (
            ("eval_every", "only at the end"),
            ("save_every", "only at the end"),
            ("num_threads", "the cores free now"),
        ):
            _check(getattr(self, k) >= 0, f"train.{k}", f"must be >= 0 (0 = {zero})")
        _check(self.max_nonfinite_steps >= 1, "train.max_nonfinite_steps", "must be >= 1")
        _check(self.signature_rows >= 0, "train.signature_rows", "must be >= 0 (0 = no plateau signatures)")
        parts = self.logger.split("+")
        _check(
            self.logger == "none" or (len(set(parts)) == len(parts) and set(parts) <= {"tensorboard", "wandb"}),
            "train.logger",
            f"must be tensorboard, wandb, tensorboard+wandb or none, got {self.logger!r}",
        )
        _check(bool(self.wandb_project.strip()), "train.wandb_project", "must not be empty")


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


def apply_cli(cfg: RunConfig, flags: dict[str, tuple[str, Any]]) -> None:
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


# ------------------------------------------------------------------ the run config
# A method's own settings are its options dataclass, declared beside the method (``Method.options``, in
# config files under ``Method.section``) and found through the registry (replaid/registry.py): this
# module names no method. Only the chosen method's section is validated and saved; a key that the chosen
# method does not read is refused in one line naming the keys it reads (refuse_unread_keys).

FIXED_SECTIONS = ("model", "data", "optim", "train", "eval")


@dataclass(eq=False)
class RunConfig:
    """method, the shared backbone (``model``), data, optim, train, eval, and the method's options
    (:attr:`options`; also reachable as ``cfg.<section>``, e.g. ``cfg.duo``, ``cfg.diffusion``)."""

    method: str = "replaid"
    preset: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # every method section set so far, by section name; switching the method keeps them (presets set
    # their method's options before an override names another method), only the chosen one counts
    sections: dict[str, Any] = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------------ the method's options
    def spec(self) -> Any:
        """The chosen method's class (imported through the registry; one ConfigError line if it cannot be)."""
        return registry.load(self.method)

    @property
    def options(self) -> Any:
        """The chosen method's options (its dataclass; None for a method without options)."""
        name = registry.section_of(self.spec())
        return None if name is None else self.section(name)

    def section(self, name: str) -> Any:
        """The options of section ``name`` (created with its defaults on first use), or None when no
        registered method declares that section."""
        if name not in self.sections:
            cls = _section_class(self.method, name)
            if cls is None:
                return None
            self.sections[name] = cls()
        return self.sections[name]

    def __getattr__(self, name: str) -> Any:  # cfg.diffusion, cfg.duo, ...: a method's section
        if name.startswith("_") or name == "sections" or "sections" not in self.__dict__:
            raise AttributeError(name)
        opts = self.section(name)
        if opts is None:
            raise AttributeError(f"RunConfig has no section {name!r}")
        return opts

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunConfig) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    # ------------------------------------------------------------------ validation
    def read_keys(self) -> tuple[list[str], str | None]:
        """(the model keys the chosen method reads, its section or None)."""
        cls = self.spec()
        return [*BACKBONE_KEYS, *getattr(cls, "model_keys", ())], registry.section_of(cls)

    def validate(self) -> RunConfig:
        try:
            cls = self.spec()
        except ConfigError as e:
            raise ConfigError(f"invalid config value method: {e}") from None
        parts: list[tuple[str, Any]] = [(k, getattr(self, k)) for k in FIXED_SECTIONS]
        sec = registry.section_of(cls)
        if sec is not None:
            parts.append((sec, self.section(sec)))
        for name, v in parts:
            for g in dataclasses.fields(v):  # NaN passes no comparison, inf passes ">= 0": refuse both
                x = getattr(v, g.name)
                _check(
                    not isinstance(x, float) or math.isfinite(x),
                    f"{name}.{g.name}",
                    f"must be a finite number, got {x}",
                )
            if hasattr(v, "validate"):
                v.validate()  # its own ranges first, then the one every float has
            for g in dataclasses.fields(v):  # every float reaches a float32 tensor or multiplies one
                x = getattr(v, g.name)
                if isinstance(x, float) and not (x == 0 or 1 / FLOAT_LIMIT <= abs(x) <= FLOAT_LIMIT):
                    raise ConfigError(
                        f"invalid config value {name}.{g.name}: {x:g} is beyond the range float32 computes in; "
                        f"give 0 or a magnitude in [{1 / FLOAT_LIMIT:g}, {FLOAT_LIMIT:g}]"
                    )
        check = getattr(cls, "check_config", None)
        if check is not None:
            check(self)  # the method's own rule on the shared sections (e.g. RePlaid's micro-batch rows)
        return self

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        """Every key this run's method reads (other methods' sections and model keys are left out)."""
        model_keys, sec = self.read_keys()
        d: dict[str, Any] = {"method": self.method, "preset": self.preset}
        d["model"] = {k: v for k, v in dataclasses.asdict(self.model).items() if k in model_keys}
        for k in FIXED_SECTIONS[1:]:
            d[k] = dataclasses.asdict(getattr(self, k))
        if sec is not None:
            d[sec] = dataclasses.asdict(self.section(sec))
        return d

    def to_json(self) -> str:
        return strict_dumps(self.to_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        """A config from its dict (a run's config.json, a checkpoint's state.json), migrated first."""
        cfg = cls()
        apply_dict(cfg, migrate_config(d))
        return cfg.validate()


def _section_class(method: str, name: str) -> type | None:
    """The options dataclass of section ``name``: the chosen method's if it is its section, else the first
    registered method's that declares it (a method that cannot be loaded is passed over)."""
    for m in (method, *registry.method_names()):
        try:
            cls = registry.load(m)
        except ConfigError:
            if m == method:
                raise
            continue
        if registry.section_of(cls) == name:
            return registry.options_of(cls)
    return None


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


def _strings_are_strings(raw: dict[str, Any], read: dict[str, Any], prefix: str) -> None:
    """A JSON file states its strings as strings: a number read into a string key is refused (a YAML
    file or an override may still spell ``data.source=5``)."""
    for k, v in raw.items():
        if isinstance(v, dict) and isinstance(read.get(k), dict):
            _strings_are_strings(v, read[k], f"{prefix}{k}.")
        elif isinstance(read.get(k), str) and not isinstance(v, str) and v not in VALUE_ALIASES.get(prefix + k, {}):
            raise ConfigError(f"config key {prefix}{k} expects a string, got {v!r}")


def _section_owners(name: str) -> list[str]:
    """The loadable registered methods whose section is ``name``."""
    out = []
    for m in registry.method_names():
        try:
            if registry.section_of(registry.load(m)) == name:
                out.append(m)
        except ConfigError:
            continue
    return out


def _model_key_owners(key: str) -> list[str]:
    """The loadable registered methods whose network reads model key ``key``."""
    out = []
    for m in registry.method_names():
        try:
            if key in getattr(registry.load(m), "model_keys", ()):
                out.append(m)
        except ConfigError:
            continue
    return out


def unread_keys(cfg: RunConfig, keys: list[str]) -> list[str]:
    """The keys of ``keys`` (``section.key``) that ``cfg.method`` never reads."""
    model_keys, sec = cfg.read_keys()
    out = []
    for key in keys:
        head, _, name = key.partition(".")
        if head in ("method", "preset", *FIXED_SECTIONS[1:]) or head == sec:
            continue
        if head != "model" or (name and name not in model_keys):
            out.append(key)
    return out


def refuse_unread_keys(cfg: RunConfig, keys: list[str]) -> None:
    """Refuse, in one line naming the keys ``cfg.method`` reads, any key a user set (``key=value``
    overrides, a YAML file) that the chosen method never reads: it would be accepted without effect."""
    bad = unread_keys(cfg, keys)
    if not bad:
        return
    key = bad[0]
    head, _, name = key.partition(".")
    owners = _model_key_owners(name) if head == "model" else _section_owners(head)
    model_keys, sec = cfg.read_keys()
    own = ", ".join(f"model.{k}" for k in model_keys if k not in BACKBONE_KEYS)
    reads = f"the backbone keys, {own}" if own else "the backbone keys"
    if sec:
        names = ", ".join(f.name for f in dataclasses.fields(cfg.section(sec)))
        reads += f" and section {sec} ({names})"
    else:
        reads += " and no section of its own"
    whose = f"belongs to method {'/'.join(owners)}" if owners else "is read by no registered method"
    fix = f" (or set method={owners[0]})" if owners else ""
    raise ConfigError(
        f"config key {key} {whose}, but this run is method={cfg.method}: drop it{fix}; "
        f"method={cfg.method} reads {reads}"
    )


def flat_keys(d: dict[str, Any], prefix: str = "") -> list[str]:
    """``section.key`` of every leaf of a nested mapping (a YAML config file)."""
    out = []
    for k, v in d.items():
        out += flat_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]
    return out


# Keys of configs written before the per-method sections: old key -> new key.
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


def migrate_config(d: dict[str, Any]) -> dict[str, Any]:
    """A stored config (any version) in the current layout; the input is not modified.

    A config of a method whose network reads ``model.in_z_std`` (RePlaid) but that lacks the key was
    written when ``W_z`` started at std ``1/sqrt(d_e)``: it gets ``-1``, which keeps that init. Before the
    per-method sections every run stored every method's options in one flat ``baseline`` section: each
    key moves to its method's section (:data:`LEGACY_KEYS`), and the sections and model keys that the
    run's method never read are dropped (they had no effect; the method declares what it reads), so an
    old run keeps loading under :func:`refuse_unread_keys`'s rule."""
    if not isinstance(d, dict):
        return d
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in d.items()}
    method = out.get("method", "replaid")
    model_keys, own = RunConfig(method=method).read_keys() if isinstance(method, str) else ([], None)
    model = out.get("model")
    if "in_z_std" in model_keys and isinstance(model, dict) and "in_z_std" not in model:
        model["in_z_std"] = -1.0  # written before model.in_z_std: W_z was initialised with std 1/sqrt(d_e)
    old = out.pop("baseline", None)
    if isinstance(old, dict):
        for k, v in old.items():
            new = LEGACY_KEYS.get(f"baseline.{k}")
            if new is None:
                raise ConfigError(f"unknown config key 'baseline.{k}' in a stored config; it is from another version")
            sec, key = new.split(".")
            out.setdefault(sec, {})[key] = v
        for sec in [k for k, v in out.items() if isinstance(v, dict) and k not in FIXED_SECTIONS and k != own]:
            out.pop(sec)
        if isinstance(model, dict):
            for k in [k for k in model if k not in model_keys]:
                model.pop(k)
    return out


def check(ok: bool, key: str, msg: str) -> None:
    """Raise ``invalid config value KEY: MSG`` (one line) unless ``ok``: the check of every section,
    a method's options included."""
    if not ok:
        raise ConfigError(f"invalid config value {key}: {msg}")


_check = check


# --------------------------------------------------------------------------- overrides


def _fields(obj: Any) -> list[str]:
    """The settable keys of a config object: a dataclass's fields; a RunConfig's are its own (not
    ``sections``) and its method's section."""
    names = [f.name for f in dataclasses.fields(obj) if f.name != "sections"]
    if isinstance(obj, RunConfig):
        try:
            sec = registry.section_of(obj.spec())
        except ConfigError:
            sec = None
        names += [sec] if sec is not None else []
    return names


def _child(obj: Any, name: str) -> Any:
    """``obj.name`` for a key being set (a RunConfig's method sections included: any registered
    method's, kept aside until :func:`refuse_unread_keys`), or raise KeyError."""
    if name == "sections":
        raise KeyError(name)
    if name in {f.name for f in dataclasses.fields(obj)}:
        return getattr(obj, name)
    sub = obj.section(name) if isinstance(obj, RunConfig) else None
    if sub is None:
        raise KeyError(name)
    return sub


def _all_keys(obj: Any, prefix: str = "") -> list[str]:
    keys = []
    for name in _fields(obj):
        v = _child(obj, name)
        if dataclasses.is_dataclass(v):
            keys += _all_keys(v, prefix + name + ".")
        else:
            keys.append(prefix + name)
    return keys


def _unknown(key: str, root: Any) -> ConfigError:
    near = difflib.get_close_matches(key, _all_keys(root), n=1, cutoff=0.5)
    hint = f"; did you mean '{near[0]}'?" if near else "; run 'replaid train --show-config' for the valid keys"
    return ConfigError(f"unknown config key '{key}'{hint}")


# Values of a key's earlier type, read as the current type's wherever a config comes from (a stored run, a --config file, a
# grid's planned configs, an override): train.compile was a bool before "auto".
VALUE_ALIASES: dict[str, dict[Any, str]] = {
    "train.compile": {True: "on", False: "off", "true": "on", "false": "off"},
}


def coerce(key: str, value: Any, typ: Any) -> Any:
    """Convert a string/YAML/JSON value to the field's declared type, or raise a ConfigError: the one type
    coercion of the config's overrides and files and of a sampling request's JSON (the playground).
    ``Optional[T]`` takes None (JSON null) or a T; ``tuple[str, ...]`` / ``list[str]`` a list of strings,
    or one string (``""``: none); a value of a key's earlier type, its alias (:data:`VALUE_ALIASES`)."""
    aliases = VALUE_ALIASES.get(key)
    if aliases is not None and isinstance(value, (bool, str)) and value in aliases:
        value = aliases[value]
    if typing.get_origin(typ) in (typing.Union, getattr(types, "UnionType", typing.Union)):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if value is None and len(args) < len(typing.get_args(typ)):
            return None
        if len(args) == 1:
            return coerce(key, value, args[0])
    if typing.get_origin(typ) in (tuple, list) and typing.get_args(typ)[:1] == (str,):
        items = ([value] if value else []) if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(x, str) for x in items):
            raise ConfigError(f"config key {key} expects a list of strings, got {str(value)[:40]!r}")
        return typing.get_origin(typ)(items)
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


_coerce = coerce


def set_key(cfg: RunConfig, key: str, value: Any) -> None:
    """Set ``section.key`` on ``cfg`` with type checking. A key of an older version (:data:`LEGACY_KEYS`)
    is refused with its new name: stored configs are migrated when read (:func:`migrate_config`), so
    only live input (an override, a YAML file, a request) can still carry one."""
    if key in LEGACY_KEYS:
        raise ConfigError(
            f"config key {key} is the name it had before the per-method sections: write {LEGACY_KEYS[key]}=... instead"
        )
    parts = key.split(".")
    obj: Any = cfg
    for i, p in enumerate(parts):
        try:
            sub = _child(obj, p)
        except KeyError:
            raise _unknown(key, cfg) from None
        if i == len(parts) - 1:
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
            obj = sub
            if not dataclasses.is_dataclass(obj):
                raise _unknown(key, cfg)


def apply_dict(obj: Any, d: dict[str, Any], prefix: str = "", root: Any = None) -> None:
    root = root if root is not None else obj
    if not isinstance(d, dict):
        raise ConfigError(f"config section {prefix or '<root>'} must be a mapping, got {type(d).__name__}")
    if isinstance(obj, RunConfig) and "method" in d:  # the method first: it decides what its section is
        d = {"method": d["method"], **d}
    for k, v in d.items():
        full = prefix + str(k)
        try:
            sub = _child(obj, str(k))
        except KeyError:
            raise _unknown(full, root) from None
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


def load_yaml(path: str | Path) -> dict[str, Any]:
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
