"""IsoFLOP sweeps: plan (method x budget C x size N -> a resolved run), run (local or SLURM), status.

The paper's protocol (sec. 4.2-4.3): for every compute budget C a set of model sizes N from the
IsoFLOP table, each trained for ``steps = C / (FLOPs per token x tokens per step)``; FLOPs are the
training FLOPs a FLOP counter sees (``training/flops.py``: 3 x forward, the output head included,
the token-embedding lookup free), so self-conditioning's extra 8.3% is paid for with fewer steps.

A sweep folder holds ``manifest.json`` (and the same rows as ``manifest.csv``), one resolved config
per run in ``configs/ID.json`` (the file ``replaid train --config`` reads; edit it to change a run),
and the runs in ``runs/ID``. :mod:`replaid.scaling.runner` runs such a manifest: it skips finished
runs (a final checkpoint with its evaluation), resumes interrupted ones and starts the rest.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from replaid import schema
from replaid.config import ConfigError, RunConfig, parse_overrides, read_run_config, set_key
from replaid.data.pipeline import DataPipeline
from replaid.presets import ISOFLOP_SIZES, isoflop_config
from replaid.scaling.runner import check_entries, legacy_final_eval, run_status
from replaid.schema import dumps as strict_dumps
from replaid.store import runfolder
from replaid.training.flops import param_counts, train_flops_per_token

# The paper's budgets (sec. 4.3) and its size table (hidden, layers, heads), labelled by size in M.
PAPER_BUDGETS = (6e18, 1e19, 3e19, 6e19, 1e20)
PAPER_SIZES: dict[str, tuple[int, int, int]] = {f"{m}M": v for m, v in ISOFLOP_SIZES.items()}
# CPU-sized table: the same shapes scaled down (V = 1024 BPE, L = 64); labels are hidden x layers.
TINY_SIZES: dict[str, tuple[int, int, int]] = {
    f"{h}x{n}": (h, n, a)
    for h, n, a in [
        (8, 1, 2),
        (12, 1, 2),
        (16, 1, 2),
        (24, 1, 2),
        (32, 1, 2),
        (32, 2, 2),
        (48, 2, 2),
        (64, 2, 4),
        (64, 3, 4),
        (80, 3, 4),
        (96, 3, 4),
        (112, 4, 4),
        (128, 4, 4),
        (160, 5, 5),
    ]
}
TINY_BUDGETS = (1e11, 3e11, 6e11)
SIZE_TABLES = {"paper": PAPER_SIZES, "tiny": TINY_SIZES}

# Method variants of the study: label -> (replaid --method, extra overrides).
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ar": ("ar", ()),
    "mdlm": ("mdlm", ("mdlm.low_variance=true",)),  # MDLM (low var.)
    "duo": ("duo", ()),
    "replaid": ("replaid", ("model.self_conditioning=true",)),  # RePlaid (s.c.)
    "replaid-nosc": ("replaid", ("model.self_conditioning=false",)),
    "plaid": ("plaid", ()),
}
CHINCHILLA_TOKENS_PER_PARAM = 20.0


def paper_protocol(hidden: int, n_layers: int, n_heads: int) -> RunConfig:
    """Sec. 4.2: SlimPajama, Llama-2 tokenizer, batch 256, L = 2048, the scaling optimiser table."""
    return isoflop_config(hidden, n_layers, n_heads)


def tiny_protocol(hidden: int, n_layers: int, n_heads: int) -> RunConfig:
    """The paper's protocol shrunk for one CPU core: 1024-token BPE, L = 64, batch 32, the scaling
    table's cosine schedule with a 10x higher peak (2e-3 -> 2e-4; 2e-4 does not move a tiny model in
    a few hundred steps), 1% warm-up (at least 10 steps), no EMA, one fixed validation subset."""
    c = paper_protocol(hidden, n_layers, n_heads)
    c.preset = "isoflop-tiny"
    c.model.cond_dim = 32
    c.data.source, c.data.tokenizer, c.data.bpe_vocab_size, c.data.seq_len = "stdlib", "bpe", 1024, 64
    c.optim.lr_backbone = c.optim.lr_projections = 2e-3
    c.optim.lr_min, c.optim.min_warmup_steps = 2e-4, 10
    c.train.batch_size, c.train.log_every = 32, 50
    c.eval.max_batches, c.eval.batch_size, c.eval.t_samples = 16, 32, 4
    return c


PROTOCOLS: dict[str, Callable[[int, int, int], RunConfig]] = {"paper": paper_protocol, "tiny": tiny_protocol}


def planned_vocab_size(cfg: RunConfig) -> int:
    """The tokenizer's vocabulary without building it (BPE: its target size)."""
    known = {"gpt2": 50257, "llama2": 32000, "bert-base-uncased": 30522, "bert-base-cased": 28996}
    return known.get(cfg.data.tokenizer, cfg.data.bpe_vocab_size)


def non_embedding_params(cfg: RunConfig, vocab_size: int) -> int:
    """The IsoFLOP table's N (everything but the input token embedding) of the model ``cfg`` builds."""
    m = cfg.model
    return param_counts(cfg.method, m.hidden, m.n_layers, m.n_heads, vocab_size, cfg=_copy(cfg))["non_embedding"]


def corpus_tokens(cfg: RunConfig) -> int:
    """Tokens one pass over the train split feeds a run of ``cfg`` (whole sequences of ``seq_len``),
    tokenising it into the cache if needed."""
    return len(DataPipeline(cfg, train=False).dataset("train")) * cfg.data.seq_len


def predicted_optimum(budget: float, tokens_per_param: float = CHINCHILLA_TOKENS_PER_PARAM) -> float:
    """Chinchilla's rule of thumb, D = 20 N and C = 6 N D, as the centre of each budget's sizes."""
    return math.sqrt(budget / (6 * tokens_per_param))


@dataclass
class PlanEntry:
    id: str
    method: str  # variant label (ar, mdlm, replaid, replaid-nosc, ...)
    budget: float  # nominal C
    size: str
    hidden: int
    n_layers: int
    n_heads: int
    params: int  # non-embedding N
    flops_per_token: float  # training FLOPs per token (3 x forward, + s.c.)
    tokens_per_step: int
    steps: int
    tokens: int
    flops: float  # steps x tokens_per_step x flops_per_token (the C actually spent)
    config: str  # configs/ID.json, relative to the sweep folder
    run_dir: str  # runs/ID, relative to the sweep folder

    def cost(self) -> float:
        """The runner's progress weight: the FLOPs this run spends."""
        return self.flops


@dataclass
class Plan:
    protocol: str
    budgets: list[float]
    methods: list[str]
    overrides: list[str]
    entries: list[PlanEntry] = field(default_factory=list)

    @property
    def total_flops(self) -> float:
        return sum(e.flops for e in self.entries)


def select_sizes(
    table: dict[str, tuple[int, int, int]],
    params: dict[str, int],
    budget: float,
    k: int,
    stride: int = 1,
    tokens_per_param: float = CHINCHILLA_TOKENS_PER_PARAM,
) -> list[str]:
    """``k`` sizes of the table (every ``stride``-th, by N) centred in log N on the predicted optimum."""
    names = sorted(table, key=lambda s: params[s])
    if k <= 0 or (stride == 1 and k >= len(names)):
        return names
    target = math.log(predicted_optimum(budget, tokens_per_param))
    centre = min(range(len(names)), key=lambda i: abs(math.log(params[names[i]]) - target))
    span = (k - 1) * stride
    lo = max(0, min(centre - span // 2, len(names) - 1 - span))
    picked = [names[i] for i in range(lo, lo + span + 1, stride) if i < len(names)]
    return picked


def make_plan(
    methods: Sequence[str],
    budgets: Sequence[float],
    sizes: str = "paper",
    per_budget: int = 0,
    stride: int = 1,
    protocol: str | None = None,
    overrides: Sequence[str] = (),
    save_checkpoints: int = 4,
    tokens_per_param: float | Mapping[str, float] = CHINCHILLA_TOKENS_PER_PARAM,
    max_tokens: float = 0.0,
) -> Plan:
    """Every (method, budget, size) run: a resolved config and its step count from the budget.

    ``sizes``: ``paper`` | ``tiny`` | comma-separated labels of either table. ``per_budget``: how many
    sizes around the predicted optimum (``D = tokens_per_param x N``) each budget trains (0 = all),
    every ``stride``-th of the table; a mapping gives each method its own centre (key ``*``: the others'),
    since methods' optima differ (MDLM wants more tokens per parameter than AR at small scale).
    ``max_tokens`` > 0 (the corpus' train tokens): sizes whose run would read more are left out before
    the selection, so that no run repeats data. ``overrides`` (``key=value``)
    apply to every run after the protocol and the method variant; ``save_checkpoints`` checkpoints
    per run let an interrupted run resume (the final one is always written)."""
    for m in methods:
        if m not in VARIANTS:
            raise ConfigError(f"unknown scaling method '{m}'; choose from {', '.join(VARIANTS)}")
    table, proto = _size_table(sizes, protocol)
    if proto not in PROTOCOLS:
        raise ConfigError(f"unknown protocol '{proto}'; choose {' or '.join(PROTOCOLS)}")
    _check_budgets(budgets)
    plan = Plan(proto, [float(b) for b in budgets], list(methods), list(overrides))
    cfgs, params = _configs(methods, table, proto, overrides)
    tpp = dict(tokens_per_param) if isinstance(tokens_per_param, Mapping) else {"*": tokens_per_param}
    unknown = set(tpp) - set(methods) - {"*"}
    if unknown or any(v <= 0 for v in tpp.values()):
        raise ConfigError(
            f"--tokens-per-param: positive numbers, per method as METHOD=X for methods of the plan "
            f"({', '.join(methods)}); got {sorted(unknown) or tpp}"
        )
    cost = {}  # (method, size) -> (training FLOPs per token, tokens per step)
    for (m, s), cfg in cfgs.items():
        fpt = train_flops_per_token(cfg, planned_vocab_size(cfg), include_embedding=True)
        cost[m, s] = (fpt, cfg.train.batch_size * cfg.data.seq_len)
    for b in plan.budgets:  # budget-major: an interrupted sweep still has whole budgets
        for m in methods:
            fits = _fitting_sizes(b, m, table, cost, max_tokens)
            p_m = {s: params[m, s] for s in fits}
            centre = tpp.get(m, tpp.get("*", CHINCHILLA_TOKENS_PER_PARAM))
            for s in select_sizes({s: table[s] for s in fits}, p_m, b, per_budget, stride, centre):
                cfg = _copy(cfgs[m, s])
                fpt, tps = cost[m, s]
                steps = _steps(b, fpt, tps)
                if steps >= 2**53:  # beyond what a float (JSON, the CSV) counts exactly, and any run
                    raise ConfigError(f"budget {b:.3g} gives {m} {s} {steps:.3g} steps; use smaller budgets")
                cfg.train.steps = steps
                if save_checkpoints > 1 and steps >= 2 * save_checkpoints:
                    cfg.train.save_every = steps // save_checkpoints
                rid = f"{m}_C{b:.3g}_{s}".replace("+", "")
                e = PlanEntry(
                    rid,
                    m,
                    b,
                    s,
                    cfg.model.hidden,
                    cfg.model.n_layers,
                    cfg.model.n_heads,
                    p_m[s],
                    fpt,
                    tps,
                    steps,
                    steps * tps,
                    steps * tps * fpt,
                    f"configs/{rid}.json",
                    f"runs/{rid}",
                )
                e._cfg = cfg  # type: ignore[attr-defined]
                plan.entries.append(e)
    return plan


def _size_table(sizes: str, protocol: str | None) -> tuple[dict[str, tuple[int, int, int]], str]:
    """The sizes (label -> (hidden, layers, heads)) that ``sizes`` names and the protocol they train under."""
    if sizes in SIZE_TABLES:
        return SIZE_TABLES[sizes], protocol or sizes
    labels = [s.strip() for s in sizes.split(",") if s.strip()]
    every = {**PAPER_SIZES, **TINY_SIZES}
    bad = [s for s in labels if s not in every]
    if bad or not labels:
        raise ConfigError(
            f"unknown size(s) {bad or sizes!r}; use paper, tiny, or labels such as "
            f"{', '.join(list(PAPER_SIZES)[:2] + list(TINY_SIZES)[:2])}"
        )
    return {s: every[s] for s in labels}, protocol or ("tiny" if all(s in TINY_SIZES for s in labels) else "paper")


def _check_budgets(budgets: Sequence[float]) -> None:
    """Positive budgets, distinct to the 3 significant digits that name a run."""
    if any(b <= 0 for b in budgets) or not budgets:
        raise ConfigError("--budgets must be positive FLOP counts, e.g. 6e18 1e19")
    by_label: dict[str, float] = {}
    for b in budgets:  # a run's id names its budget to 3 significant digits: two budgets, two ids
        lab = f"{float(b):.3g}"
        if lab in by_label:
            raise ConfigError(
                f"--budgets {by_label[lab]:g} and {float(b):g} are the same budget to 3 significant digits (run ids "
                f"C{lab.replace('+', '')}); give each budget once"
            )
        by_label[lab] = float(b)


def _configs(
    methods: Sequence[str], table: dict[str, tuple[int, int, int]], proto: str, overrides: Sequence[str]
) -> tuple[dict[tuple[str, str], RunConfig], dict[tuple[str, str], int]]:
    """Each (method, size)'s validated config (the protocol, the method variant, then ``overrides``) and
    its non-embedding parameter count."""
    cfgs, params = {}, {}
    for m in methods:
        base_method, extra = VARIANTS[m]
        for s, (h, n, a) in table.items():
            cfg = PROTOCOLS[proto](h, n, a)
            for k, v in parse_overrides([f"method={base_method}", *extra, *overrides]):
                set_key(cfg, k, v)
            cfgs[m, s] = cfg.validate()
            params[m, s] = non_embedding_params(cfg, planned_vocab_size(cfg))
    return cfgs, params


def _fitting_sizes(
    b: float, m: str, table: dict[str, Any], cost: dict[tuple[str, str], tuple[float, int]], max_tokens: float
) -> list[str]:
    """The sizes of method ``m`` that budget ``b`` trains for at least one step, reading at most
    ``max_tokens`` tokens (> 0); none is an error naming the fix."""
    one_step = {s: cost[m, s][0] * cost[m, s][1] for s in table}  # FLOPs of one training step
    if all(b / one_step[s] < 0.5 for s in table):  # even the smallest run would be >= 2x the budget
        s0 = min(table, key=lambda s: one_step[s])
        raise ConfigError(
            f"budget {b:.3g} FLOPs is below one training step of every size of {m} (the smallest, {s0}, "
            f"takes {one_step[s0]:.3g} FLOPs a step); give budgets of at least {one_step[s0]:.3g}"
        )
    fits = [
        s
        for s in table
        if b / one_step[s] >= 0.5  # at least one step, not a step rounded up from nothing
        and (max_tokens <= 0 or _steps(b, *cost[m, s]) * cost[m, s][1] <= max_tokens)
    ]
    if not fits:
        raise ConfigError(
            f"budget {b:.3g}: every size of {m} would read more than --max-tokens "
            f"{max_tokens:.3g} tokens; use smaller budgets or larger sizes"
        )
    return fits


def _steps(budget: float, flops_per_token: float, tokens_per_step: int) -> int:
    """Training steps that spend ``budget`` FLOPs."""
    return max(1, int(round(budget / (flops_per_token * tokens_per_step))))


def _copy(cfg: RunConfig) -> RunConfig:
    return RunConfig.from_dict(cfg.to_dict())


CSV_FIELDS = [f for f in PlanEntry.__dataclass_fields__]


def write_plan(plan: Plan, sweep: Path, force: bool = False) -> Path:
    """``manifest.json``, ``manifest.csv`` and ``configs/ID.json``; never overwrites another manifest."""
    sweep = Path(sweep)
    man = sweep / "manifest.json"
    if man.exists() and not force:
        raise ConfigError(f"{man} exists; pick a new --out, or pass --force to re-plan that sweep (runs are kept)")
    if sweep.exists() and not sweep.is_dir():
        raise ConfigError(f"--out {sweep} is a file; choose a folder for the sweep")
    if sweep.is_dir() and not man.exists() and any(sweep.iterdir()):
        raise ConfigError(f"--out {sweep} is a non-empty folder that holds no sweep; choose a new or empty folder")
    (sweep / "configs").mkdir(parents=True, exist_ok=True)
    for e in plan.entries:
        (sweep / e.config).write_text(e._cfg.to_json())  # type: ignore[attr-defined]
    obj = {
        "version": 1,
        "protocol": plan.protocol,
        "methods": plan.methods,
        "budgets": plan.budgets,
        "overrides": plan.overrides,
        "total_flops": plan.total_flops,
        "runs": [asdict(e) for e in plan.entries],
    }
    tmp = man.with_suffix(".json.tmp")
    tmp.write_text(strict_dumps(obj, indent=1))
    os.replace(tmp, man)
    with open(sweep / "manifest.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for e in plan.entries:
            w.writerow(asdict(e))
    return man


def read_manifest(sweep: Path) -> list[PlanEntry]:
    man = Path(sweep) / "manifest.json"
    if not man.is_file():
        raise ConfigError(f"{sweep} has no manifest.json; make one with 'replaid scaling plan --out {sweep}'")
    fix = "re-plan the sweep with 'replaid scaling plan' (its runs are kept)"
    rows = schema.read_json(man, schema.MANIFEST, fix)["runs"]
    entries = [
        PlanEntry(**{k: schema.validate(r, schema.PLAN_RUN, f"{man}: runs[{i}]", fix)[k] for k in schema.PLAN_RUN})
        for i, r in enumerate(rows)
    ]
    check_entries(Path(sweep), entries, man)
    return entries


# ------------------------------------------------------------------ results


def final_loss(sweep: Path, e: PlanEntry) -> dict[str, Any] | None:
    """The finished run's final validation evaluation (``nelbo``/``nll`` nats per token and more)."""
    run = Path(sweep) / e.run_dir
    if run_status(sweep, e)[0] != "done":
        return None
    fe = runfolder.read_final_eval(run)
    ev = fe["eval"] if fe and isinstance(fe.get("eval"), dict) else legacy_final_eval(run)
    if not ev:
        return None
    key = "nelbo_nats_per_token" if "nelbo_nats_per_token" in ev else "nll_nats_per_token"
    return {"loss": ev[key], "stderr": ev.get("stderr_nats"), **ev}


def results_table(sweep: Path) -> list[dict[str, Any]]:
    """One row per finished run: method, budget, size, flops, params, tokens, loss, seed."""
    rows = []
    for e in read_manifest(sweep):
        r = final_loss(sweep, e)
        if r is None:
            continue
        run_cfg = Path(sweep) / e.run_dir / "config.json"
        cfg = run_cfg if run_cfg.is_file() else Path(sweep) / e.config
        train = read_run_config(cfg).train if cfg.is_file() else None
        steps = train.steps if train is not None and run_cfg.is_file() else e.steps
        rows.append(
            {
                "method": e.method,
                "budget": e.budget,
                "size": e.size,
                "params": e.params,
                "flops": steps * e.tokens_per_step * e.flops_per_token,
                "tokens": steps * e.tokens_per_step,
                "loss": r["loss"],
                "stderr": r.get("stderr"),
                "unigram": r.get("unigram_nats_per_token"),
                "id": e.id,
                "seed": train.seed if train is not None else 0,  # runs differing only in train.seed are replicates
            }
        )
    return rows
