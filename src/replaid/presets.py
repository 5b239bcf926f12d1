"""Named presets: the paper's model sizes and optimiser tables, plus small CPU presets."""

from __future__ import annotations

import difflib
from collections.abc import Callable

from replaid.config import (
    ConfigError,
    OptimConfig,
    RunConfig,
    apply_dict,
    flat_keys,
    load_yaml,
    parse_overrides,
    refuse_unread_keys,
    set_key,
)

# Paper Table "IsoFLOP transformer configurations": non-embedding params (M) -> (hidden, layers, heads)
ISOFLOP_SIZES: dict[int, tuple[int, int, int]] = {
    14: (256, 6, 4),
    29: (384, 8, 6),
    44: (512, 8, 8),
    58: (576, 9, 9),
    74: (640, 10, 10),
    91: (640, 13, 10),
    107: (640, 16, 8),
    116: (768, 12, 12),
    140: (768, 15, 12),
    163: (768, 18, 12),
    173: (896, 14, 14),
    194: (896, 16, 14),
    214: (896, 18, 14),
    247: (1024, 16, 16),
    274: (1024, 18, 16),
    300: (1024, 20, 16),
    413: (1280, 18, 10),
    475: (1280, 21, 10),
    493: (1408, 18, 11),
    537: (1280, 24, 10),
    568: (1408, 21, 11),
    642: (1408, 24, 11),
    698: (1536, 22, 12),
    787: (1536, 25, 12),
    1016: (1792, 24, 14),
    1208: (2048, 22, 16),
    1364: (2048, 25, 16),
    1708: (2176, 28, 17),
}


def optim_small() -> OptimConfig:
    """Paper table "Optimization details for RePlaid at the 0.1B scale"."""
    return OptimConfig(
        lr_schedule="constant",
        warmup_steps=2500,
        warmup_frac=0.0,
        lr_backbone=3e-4,
        lr_projections=3e-4,
        lr_embedding=1e-2,
        lr_schedule_mlp=1e-2,
        lr_endpoints=1e-2,
        wd_backbone=0.0,
        wd_projections=0.0,
        wd_embedding=0.0,
        wd_schedule_mlp=0.0,
        wd_endpoints=0.1,
        beta1=0.9,
        beta2=0.999,
        ema=0.9999,
    )


def optim_plaid() -> OptimConfig:
    """Paper table "Optimization details for Plaid at the 0.1B scale": Plaid's per-component values
    after muP rescaling (MuAdam), passed to AdamW as they are."""
    return OptimConfig(
        lr_schedule="constant",
        warmup_steps=2500,
        warmup_frac=0.0,
        lr_backbone=4.67e-4,
        lr_norms_head=1.4e-3,
        lr_projections=1.4e-3,
        lr_embedding=1e-2,
        lr_schedule_mlp=1e-2,
        lr_endpoints=1e-2,
        wd_backbone=0.086,
        wd_norms_head=0.029,
        wd_projections=0.029,
        wd_embedding=0.0,
        wd_schedule_mlp=0.0,
        wd_endpoints=0.1,
        beta1=0.9,
        beta2=0.99,
        ema=0.9999,
    )


def optim_scaling() -> OptimConfig:
    """Paper table "Optimization details for RePlaid in scaling law experiments"."""
    return OptimConfig(
        lr_schedule="cosine",
        warmup_frac=0.01,
        min_warmup_steps=100,
        lr_min=2e-5,
        lr_backbone=2e-4,
        lr_projections=2e-4,
        lr_embedding=1e-2,
        lr_schedule_mlp=1e-2,
        lr_endpoints=1e-2,
        wd_backbone=0.1,
        wd_projections=0.1,
        wd_embedding=0.0,
        wd_schedule_mlp=0.0,
        wd_endpoints=0.1,
        beta1=0.9,
        beta2=0.95,
        ema=0.0,
    )


def debug() -> RunConfig:
    """Seconds on CPU: for tests."""
    c = RunConfig(preset="debug")
    c.model.hidden, c.model.n_layers, c.model.n_heads, c.model.cond_dim = 32, 2, 2, 16
    c.diffusion.schedule_hidden = 64
    c.data.seq_len, c.data.bpe_vocab_size, c.data.max_docs = 32, 512, 300
    c.optim = optim_small()
    c.optim.warmup_steps, c.optim.ema, c.optim.lr_backbone, c.optim.lr_projections = 5, 0.9, 1e-3, 1e-3
    c.train.steps, c.train.batch_size, c.train.log_every = 20, 8, 5
    c.eval.max_batches, c.eval.batch_size, c.eval.t_samples = 2, 8, 2
    return c


def demo() -> RunConfig:
    """A small RePlaid on the embedded stdlib corpus, minutes on 2 CPU cores: the size of most CPU results
    (the README's main job is the first-run preset: this network with a larger tokenizer)."""
    c = RunConfig(preset="demo")
    c.model.hidden, c.model.n_layers, c.model.n_heads, c.model.cond_dim = 128, 4, 4, 64
    c.diffusion.schedule_hidden = 256
    c.data.seq_len, c.data.bpe_vocab_size = 64, 2048
    c.optim = optim_small()
    c.optim.warmup_steps, c.optim.ema = 100, 0.99
    c.optim.lr_backbone = c.optim.lr_projections = 1e-3
    c.train.steps, c.train.batch_size, c.train.log_every = 1800, 32, 50
    c.eval.max_batches, c.eval.batch_size, c.eval.t_samples = 0, 32, 8
    return c


def first_run() -> RunConfig:
    """The README's main job (scripts/demo.sh): the demo network on the embedded stdlib corpus with a
    4,096-token BPE (L = 64, so about 4 characters a token) for 1,200 steps, about six minutes on 2 CPU
    cores; chosen among six candidates by an AR judge's GenPPL (docs/results/demo/first-run/)."""
    c = demo()
    c.preset = "first-run"
    c.data.bpe_vocab_size = 4096
    c.train.steps = 1200
    return c


def owt_01b() -> RunConfig:
    """The paper's 0.1B OpenWebText model (L=1024, GPT-2 tokenizer, batch 512, 1M steps)."""
    c = RunConfig(preset="owt-0.1b")
    c.model.hidden, c.model.n_layers, c.model.n_heads, c.model.dropout = 768, 12, 12, 0.1
    c.data.source, c.data.tokenizer, c.data.seq_len = "hf:openwebtext", "gpt2", 1024
    c.optim = optim_small()
    c.train.steps, c.train.batch_size, c.train.log_every = 1_000_000, 512, 100
    c.train.eval_every, c.train.save_every = 10_000, 10_000
    c.eval.max_batches, c.eval.batch_size = 0, 32
    return c


def owt_01b_plaid() -> RunConfig:
    """The original Plaid at 0.1B on OpenWebText: Plaid's muP optimiser table and its 5000-step
    output-prior ramp (no dropout)."""
    c = owt_01b()
    c.preset, c.method = "owt-0.1b-plaid", "plaid"
    c.model.dropout = 0.0
    c.optim = optim_plaid()
    c.diffusion.prior_ramp_steps = 5000
    return c


def owt_01b_duo() -> RunConfig:
    """Duo at 0.1B on OpenWebText with the published curriculum (s-sahoo/duo
    ``scripts/train_owt_duo.sh``): tau = 1e-3 throughout, gamma in [-3.55, -1.85], curriculum
    over the first 500k of the 1M steps, then the true NELBO."""
    c = owt_01b()
    c.preset, c.method = "owt-0.1b-duo", "duo"
    d = c.duo
    d.curriculum_start, d.curriculum_end = 0.0, 0.5
    d.gamma_min, d.gamma_max = -3.55, -1.85
    d.tau_log10_start = d.tau_log10_end = -3.0
    return c


def lm1b() -> RunConfig:
    """LM1B at L=128 (bert-base-uncased as MDLM; sentence packing on)."""
    c = owt_01b()
    c.preset = "lm1b"
    c.data.source, c.data.tokenizer, c.data.seq_len = "hf:lm1b", "bert-base-uncased", 128
    return c


def isoflop_config(hidden: int, n_layers: int, n_heads: int, name: str = "isoflop") -> RunConfig:
    """The paper's scaling protocol (sec. 4.2) at one transformer shape: SlimPajama, Llama-2
    tokenizer, L = 2048, batch 256, the scaling-law optimiser table."""
    c = RunConfig(preset=name)
    c.model.hidden, c.model.n_layers, c.model.n_heads = hidden, n_layers, n_heads
    c.data.source, c.data.tokenizer, c.data.seq_len = "hf:slimpajama", "llama2", 2048
    c.optim = optim_scaling()
    c.train.batch_size, c.train.log_every = 256, 100
    return c


def isoflop(size_m: int) -> Callable[[], RunConfig]:
    def make() -> RunConfig:
        return isoflop_config(*ISOFLOP_SIZES[size_m], name=f"isoflop-{size_m}m")

    make.__doc__ = f"IsoFLOP model table: {size_m}M non-embedding parameters, scaling-law optimiser table."
    return make


PRESETS: dict[str, Callable[[], RunConfig]] = {
    "debug": debug,
    "demo": demo,
    "first-run": first_run,
    "owt-0.1b": owt_01b,
    "owt-0.1b-plaid": owt_01b_plaid,
    "owt-0.1b-duo": owt_01b_duo,
    "lm1b": lm1b,
    **{f"isoflop-{m}m": isoflop(m) for m in ISOFLOP_SIZES},
}


def get_preset(name: str) -> RunConfig:
    if name not in PRESETS:
        near = difflib.get_close_matches(name, list(PRESETS), n=1)
        hint = f"did you mean '{near[0]}'?" if near else "see 'replaid presets'"
        raise ConfigError(f"unknown preset '{name}'; {hint}")
    return PRESETS[name]()


def resolve(preset: str | None, yaml_path: str | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Preset, then YAML file, then ``key=value`` overrides; validated."""
    cfg = get_preset(preset or "demo")
    keys: list[str] = []
    if yaml_path:
        d = load_yaml(yaml_path)
        try:
            apply_dict(cfg, d, root=cfg)
        except ConfigError as e:
            raise ConfigError(f"config file {yaml_path}: {e}") from None
        keys += flat_keys(d)
    from_yaml = list(keys)
    for k, v in parse_overrides(overrides or []):
        set_key(cfg, k, v)
        keys.append(k)
    try:
        refuse_unread_keys(cfg, keys)
        return cfg.validate()
    except ConfigError as e:  # a key the YAML file set: name the file (YA6)
        if any(k in str(e) for k in from_yaml if k not in keys[len(from_yaml) :]):
            raise ConfigError(f"config file {yaml_path}: {e}") from None
        raise
