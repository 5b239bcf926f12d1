"""One layout check for a run on N ranks, shared by ``plan-cluster``, ``train --nodes``, ``grid run
--nodes-per-job``, ``scaling run`` (slurm with ``--gpus-per-job``) and the trainer itself (a new run and a
resume): the global batch ``train.batch_size`` splits over the ranks and ``train.grad_accum`` into
micro-batches of at least 2 rows (what :class:`~replaid.data.pipeline.DataPipeline` needs; a batch that
does not split would silently train a smaller one), HSDP's shard group ``train.hsdp_shard`` divides the
ranks, and, where a GPU is stated (``--gpu-memory-gb`` of ``plan-cluster``, ``train --nodes``, ``grid run`` and
``scaling run``), the memory per GPU fits it.
Each refusal is one line naming the rank counts that work."""

from __future__ import annotations

from replaid.config import ConfigError, RunConfig

MIN_MICRO = 2  # rows per rank and accumulation step (DataPipeline refuses fewer)


def batch_problem(batch: int, accum: int, world: int) -> str:
    """Why ``batch`` sequences per step do not split over ``world`` ranks x ``accum`` micro-batches, or ""."""
    if batch % world:
        return f"train.batch_size={batch} does not split over {world} ranks"
    if (batch // world) % accum:
        return (
            f"train.grad_accum={accum} does not divide the {batch // world} rows per rank of train.batch_size={batch}"
        )
    if batch // world // accum < MIN_MICRO:
        return (
            f"train.batch_size={batch} over {world} ranks x train.grad_accum={accum} leaves "
            f"{batch // world // accum} row(s) per micro-batch (at least {MIN_MICRO})"
        )
    return ""


def rank_counts(batch: int, accum: int, upto: int = 0) -> list[int]:
    """The rank counts (up to ``upto``, default the batch) over which ``batch`` splits with ``accum``."""
    return [n for n in range(1, (upto or batch) + 1) if not batch_problem(batch, accum, n)]


def hsdp_problem(shard: int, world: int) -> str:
    """Why HSDP's shard group of ``shard`` ranks (``train.hsdp_shard``, else the GPUs of one node) does not
    divide ``world`` ranks, or ""."""
    if shard < 1 or world % shard:
        divisors = [d for d in range(1, world + 1) if world % d == 0]
        return (
            f"train.hsdp_shard={shard} does not divide the {world} ranks (HSDP's shard group): pick one of "
            f"{', '.join(map(str, divisors))}"
        )
    return ""


STATE_PARTS = ("parameters", "gradients", "AdamW moments", "EMA")  # what FSDP/HSDP shard (the memory model's parts)


def shard_ranks(parallel: str, world: int, hsdp_shard: int) -> int:
    """Ranks over which ``parallel`` shards the parameters and optimiser state (DDP: none)."""
    return {"ddp": 1, "fsdp": world, "hsdp": hsdp_shard}[parallel]


def gpu_memory(cfg: RunConfig, vocab: int, micro: int, shard: int, params: tuple[int, int] | None = None) -> float:
    """Peak bytes per GPU of one step at ``micro`` rows per micro-batch (the memory model,
    :func:`~replaid.training.memory.estimate`, bf16 unless ``train.precision=fp32``), the states sharded over
    ``shard`` ranks (:func:`shard_ranks`)."""
    from replaid.training.memory import estimate

    e = estimate(cfg, vocab, micro, bf16=cfg.train.precision != "fp32", params=params)
    states = sum(e.parts[k] for k in STATE_PARTS)
    return e.peak - states + states / shard


def memory_problem(cfg: RunConfig, world: int, per_node: int, gpu_gb: float, vocab: int) -> str:
    """Why a step of ``cfg`` on ``world`` ranks does not fit ``gpu_gb`` GB per GPU, or "" (its layout
    already checked). Names the ``train.grad_accum`` that fits, if one does."""
    from replaid.training.memory import param_counts, preset_vocab

    V, b, a = vocab or preset_vocab(cfg), cfg.train.batch_size, cfg.train.grad_accum
    shard = shard_ranks(cfg.train.parallel, world, cfg.train.hsdp_shard or per_node or world)
    counts = param_counts(cfg, V)
    need = gpu_memory(cfg, V, b // world // a, shard, counts)
    if need <= gpu_gb * 1e9:
        return ""
    per = b // world
    fit = [
        k
        for k in range(a + 1, per // MIN_MICRO + 1)
        if per % k == 0 and gpu_memory(cfg, V, per // k, shard, counts) <= gpu_gb * 1e9
    ]
    fix = f"train.grad_accum={fit[0]} fits" if fit else "no train.grad_accum fits"
    return (
        f"a step needs about {need / 1e9:.1f} GB per GPU (micro-batches of {b // world // a} rows, train.parallel="
        f"{cfg.train.parallel}, the memory model of 'replaid memory'), over the stated {gpu_gb:g} GB; {fix}, or set "
        f"model.activation_checkpointing=true or train.parallel=fsdp"
    )


def check_layout(
    cfg: RunConfig, world: int, per_node: int = 0, where: str = "", gpu_gb: float = 0.0, vocab: int = 0
) -> None:
    """Refuse (ConfigError, one line) a run of ``cfg`` on ``world`` ranks (``per_node`` a node) that cannot
    run as configured; ``where``: what asked (``--nodes 2 --gpus-per-node 3``); ``gpu_gb`` > 0: the stated
    memory per GPU, which a step must fit (``vocab``: the tokenizer's size, 0: the preset's)."""
    at = f"{where}: " if where else ""
    b, a = cfg.train.batch_size, cfg.train.grad_accum
    why = batch_problem(b, a, world)
    if why:
        works = rank_counts(b, a, max(world * 2, 8))
        raise ConfigError(
            f"{at}{why}; it runs on {', '.join(map(str, works)) or 'no'} rank(s) with train.grad_accum={a}: change "
            f"the rank count, train.batch_size or train.grad_accum"
        )
    why = hsdp_problem(cfg.train.hsdp_shard or per_node or world, world) if cfg.train.parallel == "hsdp" else ""
    if why:
        raise ConfigError(f"{at}{why}")
    why = memory_problem(cfg, world, per_node, gpu_gb, vocab) if gpu_gb > 0 else ""
    if why:
        raise ConfigError(f"{at}{why}")


def check_resume_layout(batch: int, accum: int, world: int, saved_world: int) -> None:
    """A resume on ``world`` ranks of a checkpoint saved on ``saved_world``: the batch must split (the
    trainer has already carried the micro-batch over where it could); one line saying that the checkpoint
    is intact and naming the rank counts it resumes on."""
    why = batch_problem(batch, accum, world)
    if not why:
        return
    works = rank_counts(batch, accum, max(world, saved_world) * 2)
    raise ConfigError(
        f"--resume on {world} ranks: {why}; the checkpoint (saved on {saved_world} rank(s)) is intact: resume it "
        f"on {', '.join(map(str, works))} rank(s)"
    )
