"""A scaling model of one training run on N nodes x G GPUs (``replaid plan-cluster``).

For a preset (the model, the sequence length), a global batch, a parallelism and a FLOP budget:

* **memory per GPU**: :func:`replaid.training.memory.estimate` at the per-GPU micro-batch, with the
  parameters, gradients, AdamW moments and EMA divided over the ranks that shard them (FSDP2: all;
  HSDP: the G of one node; DDP: none);
* **bytes each GPU sends per optimiser step**, from what FSDP2 issues (checked against gloo runs in
  ``tests/test_cluster.py``, which count the collectives' sizes): per micro-batch, an all-gather of
  every DiT block's parameters in the forward and again in the backward (``reshard_after_forward``;
  with self-conditioning, once more for its first pass), one of the root's (not resharded after
  forward), and a reduce-scatter of all gradients; parameters
  and gradients in float32 (no mixed-precision policy). A ring collective of S bytes over n ranks sends
  ``(n - 1) / n * S`` per rank (all-reduce: twice that). HSDP does these within a node (NVLink) and
  all-reduces each node's gradient shard across nodes (InfiniBand); DDP all-reduces the gradients once
  per step (``no_sync`` on the other micro-batches). A collective spanning nodes runs at the
  InfiniBand rate;
* **step time**: compute ``train FLOPs per step / (ranks x peak x MFU)`` plus communication (bytes /
  bandwidth), with no overlap (an upper bound; with perfect overlap it is the larger of the two);
* **wall time to the budget**: ``budget / FLOPs per step`` steps of that time.

The stated rates are inputs (defaults: H100 SXM, 989 TFLOP/s dense bf16, NVLink 4 at 450 GB/s per
direction per GPU, one 400 Gb/s NDR port = 50 GB/s per GPU, MFU 0.4 until a GPU check measures it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replaid.config import ConfigError, RunConfig

F32 = 4


@dataclass
class Hardware:
    peak_flops: float = 989e12  # per GPU, dense bf16 (H100 SXM)
    mfu: float = 0.4
    nvlink: float = 450e9  # bytes/s per GPU, one direction
    ib: float = 50e9  # bytes/s per GPU across nodes
    memory: float = 80e9


def block_params(cfg: RunConfig, vocab_size: int) -> tuple[int, int]:
    """(parameters inside the DiT blocks, the others: the FSDP2 root's), of the model on the meta device."""
    from replaid.methods import get_method

    with torch.device("meta"):
        model = get_method(cfg).build_model(vocab_size)
    blocks = sum(p.numel() for b in model.backbone.blocks for p in b.parameters())
    return blocks, sum(p.numel() for p in model.parameters()) - blocks


def self_conditioned(cfg: RunConfig) -> bool:
    """Whether training runs a self-conditioning pass (continuous methods with ``model.self_conditioning``)."""
    from replaid.methods import method_class

    continuous = method_class(cfg.method).kind.continuous
    return bool(continuous and cfg.model.self_conditioning and cfg.diffusion.sc_rate > 0)


def ring(n: int, size: float, all_reduce: bool = False) -> float:
    """Bytes one rank sends in a ring all-gather / reduce-scatter (all-reduce: twice) of ``size`` bytes."""
    return (2.0 if all_reduce else 1.0) * (n - 1) / n * size if n > 1 else 0.0


def step_bytes(
    parallel: str, blocks: int, root: int, nodes: int, gpus: int, accum: int, sc: bool = False, n_layers: int = 1
) -> dict[str, float]:
    """``{"intra": bytes, "inter": bytes}`` each GPU sends per optimiser step (module docstring), and
    ``"all_gather"``/``"reduce_scatter"``/``"all_reduce"``: the collectives' total sizes (what a run
    issues, summed over calls) that the gloo test measures. ``sc``: self-conditioning, a first forward
    pass through the blocks without gradients: the blocks are all-gathered once more, and FSDP2 gathers
    one block once more in the backward (measured on torch 2.13)."""
    world, P = nodes * gpus, blocks + root
    gathers = root + blocks * (2 + int(sc)) + (blocks / n_layers if sc else 0)
    gathered = accum * gathers * F32  # total all-gathered bytes per step
    scattered = accum * P * F32
    if parallel == "ddp":
        sent = ring(world, P * F32, all_reduce=True)
        out = {"all_gather": 0.0, "reduce_scatter": 0.0, "all_reduce": P * F32}
        return {**out, ("inter" if nodes > 1 else "intra"): sent, ("intra" if nodes > 1 else "inter"): 0.0}
    if parallel == "fsdp":
        sent = ring(world, gathered) + ring(world, scattered)
        out = {"all_gather": gathered, "reduce_scatter": scattered, "all_reduce": 0.0}
        return {**out, ("inter" if nodes > 1 else "intra"): sent, ("intra" if nodes > 1 else "inter"): 0.0}
    if parallel == "hsdp":
        shard = scattered / gpus  # each node's reduced gradient shard, all-reduced across nodes per micro-batch
        return {
            "all_gather": gathered,
            "reduce_scatter": scattered,
            "all_reduce": shard if nodes > 1 else 0.0,
            "intra": ring(gpus, gathered) + ring(gpus, scattered),
            "inter": ring(nodes, shard, all_reduce=True),
        }
    raise ConfigError(f"parallel {parallel!r}: choose ddp, fsdp or hsdp")


@dataclass
class Row:
    nodes: int
    gpus: int
    micro: int
    accum: int
    memory: float
    intra: float
    inter: float
    compute_s: float
    comm_s: float
    step_s: float
    steps: float
    wall_h: float
    fits: bool = True  # the memory per GPU within the stated GPU's (Hardware.memory)


def plan(
    cfg: RunConfig,
    vocab_size: int,
    nodes: int,
    gpus: int,
    budget: float,
    parallel: str,
    hw: Hardware,
    micro: int = 0,
) -> Row:
    """One row of the table: ``cfg.train.batch_size`` sequences per step over ``nodes x gpus``;
    ``micro``: the per-GPU micro-batch (0: the largest that divides the batch and fits ``hw.memory``)."""
    from replaid.training.flops import train_flops_per_token
    from replaid.training.layout import MIN_MICRO, batch_problem, gpu_memory, hsdp_problem, rank_counts, shard_ranks
    from replaid.training.memory import param_counts

    world, B = nodes * gpus, cfg.train.batch_size
    hsdp_shard = cfg.train.hsdp_shard or gpus
    why = batch_problem(B, 1, world) or (hsdp_problem(hsdp_shard, world) if parallel == "hsdp" else "")
    if why:  # the trainer's own layout check (training/layout.py): a plan it would refuse is no plan
        works = rank_counts(B, 1, max(2 * world, 8))
        raise ConfigError(f"{nodes} node(s) x {gpus} GPUs: {why} (global batch {B} runs on {works} GPUs)")
    per = B // world
    counts = param_counts(cfg, vocab_size)
    shard = shard_ranks(parallel, world, hsdp_shard)

    def mem(m: int) -> float:
        return gpu_memory(cfg, vocab_size, m, shard, counts)

    choices = [m for m in range(per, MIN_MICRO - 1, -1) if per % m == 0]
    if micro:
        if per % micro or micro < MIN_MICRO:
            raise ConfigError(
                f"micro-batch {micro} does not divide the {per} sequences per GPU into micro-batches of at "
                f"least {MIN_MICRO} rows"
            )
        m = micro
    else:
        m = next((c for c in choices if mem(c) <= hw.memory), choices[-1])
    accum = per // m
    blocks, root = block_params(cfg, vocab_size)
    b = step_bytes(parallel, blocks, root, nodes, gpus, accum, self_conditioned(cfg), cfg.model.n_layers)
    flops = train_flops_per_token(cfg, vocab_size) * B * cfg.data.seq_len
    compute = flops / (world * hw.peak_flops * hw.mfu)
    comm = b["intra"] / hw.nvlink + b["inter"] / hw.ib
    steps = budget / flops
    return Row(nodes, gpus, m, accum, mem(m), b["intra"], b["inter"], compute, comm, compute + comm, steps,
               steps * (compute + comm) / 3600, mem(m) <= hw.memory)  # fmt: skip
