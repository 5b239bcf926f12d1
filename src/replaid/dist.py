"""torch.distributed glue for ``torchrun``: process group, device, DDP/FSDP2 wrapping, collectives.

Everything degrades to single-process no-ops when not launched by torchrun, so the same
``replaid train`` command runs on a laptop and under ``torchrun --nproc_per_node N``.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from typing import Any, cast

import torch
import torch.distributed as tdist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.nn.parallel import DistributedDataParallel as DDP


def is_dist() -> bool:
    return tdist.is_available() and tdist.is_initialized()


def rank() -> int:
    return tdist.get_rank() if is_dist() else 0


def world_size() -> int:
    return tdist.get_world_size() if is_dist() else 1


def is_main() -> bool:
    return rank() == 0


def setup_device(device: torch.device) -> torch.device:
    """Initialise the process group when launched by torchrun (gloo on CPU, nccl on GPU)."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and not is_dist():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            local = int(os.environ.get("LOCAL_RANK", 0))
            torch.cuda.set_device(local)
            device = torch.device("cuda", local)
        tdist.init_process_group(backend=backend)
    elif device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def hsdp_mesh_shape(shard: int = 0) -> tuple[int, int]:
    """``(replicate, shard)`` of HSDP's 2-D device mesh over this run's ranks: ``shard`` ranks hold one
    copy of the sharded state (0: the ranks of one node, torchrun's ``LOCAL_WORLD_SIZE``), and the
    ``world / shard`` groups replicate it (gradients all-reduced across them), as torchtitan's
    ``dp_replicate`` x ``dp_shard``. Raises ValueError when ``shard`` does not divide the world size."""
    world = world_size()
    shard = shard or int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if shard < 1 or world % shard:
        raise ValueError(
            f"train.hsdp_shard={shard} does not divide the {world} ranks: pick a divisor of the world size "
            f"(e.g. the GPUs per node)"
        )
    return world // shard, shard


def wrap_model(module: nn.Module, parallel: str, device: torch.device, hsdp_shard: int = 0) -> nn.Module:
    """DDP, or FSDP2 (``fully_shard`` on each DiT block, then the root), when distributed. ``hsdp``:
    FSDP2 on a 2-D ``(replicate, shard)`` device mesh (:func:`hsdp_mesh_shape`): parameters sharded
    within a shard group, replicated across groups."""
    if not is_dist():
        return module
    if parallel in ("fsdp", "hsdp"):
        from torch.distributed.fsdp import fully_shard

        kw: dict[str, Any] = {}
        if parallel == "hsdp":
            from torch.distributed.device_mesh import init_device_mesh

            shape = hsdp_mesh_shape(hsdp_shard)
            kw["mesh"] = init_device_mesh(device.type, shape, mesh_dim_names=("dp_replicate", "dp_shard"))
        for blk in cast(Any, module).model.backbone.blocks:  # TrainModule(model).model.backbone
            fully_shard(blk, **kw)
        fully_shard(module, **kw)
        return module
    return DDP(module, device_ids=[device.index] if device.type == "cuda" else None)


def no_sync(module: nn.Module) -> AbstractContextManager[None]:
    """Skip the gradient all-reduce of a gradient-accumulation micro-batch (DDP; a no-op otherwise)."""
    return module.no_sync() if isinstance(module, DDP) else nullcontext()


def plain(x: Tensor) -> Tensor:
    """A full plain tensor of a (possibly FSDP2-sharded) DTensor; others as they are."""
    return x.full_tensor() if isinstance(x, DTensor) else x


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model``'s parameters are FSDP2 DTensors."""
    return any(isinstance(p, DTensor) for p in model.parameters())


def all_gather_cat(x: Tensor) -> Tensor:
    """Concatenate a 1-D tensor across ranks (lengths may differ)."""
    if not is_dist():
        return x
    x = x.detach().contiguous()
    n = torch.tensor([x.numel()], device=x.device)
    sizes = [torch.zeros_like(n) for _ in range(world_size())]
    tdist.all_gather(sizes, n)
    m = int(max(s.item() for s in sizes))
    pad = torch.zeros(m, dtype=x.dtype, device=x.device)
    pad[: x.numel()] = x
    out = [torch.zeros_like(pad) for _ in range(world_size())]
    tdist.all_gather(out, pad)
    return torch.cat([o[: int(s.item())] for o, s in zip(out, sizes, strict=True)])


def all_reduce_sum(x: Tensor) -> Tensor:
    if is_dist():
        x = x.clone()
        tdist.all_reduce(x)
    return x


def full_tensors(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Unsharded CPU copies of a state dict's tensors (``full_tensor`` is a collective for DTensors)."""
    return {k: plain(v).detach().cpu() for k, v in sd.items()}


def full_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """A full (unsharded) CPU state dict, also for FSDP2-sharded parameters."""
    return full_tensors(model.state_dict())


def shard_like(full: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """Place full tensors like the model's state: DTensors are re-sharded on their mesh, so a
    checkpoint from any world size loads into any other."""
    out = {}
    for k, v in model.state_dict().items():
        t = full[k].to(v.device, v.dtype)
        out[k] = distribute_tensor(t, v.device_mesh, v.placements) if isinstance(v, DTensor) else t
    return out


def optimizer_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Full optimizer state keyed by parameter names (same format for plain, DDP and FSDP2)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_optimizer_state(model: nn.Module, opt: torch.optim.Optimizer, osd: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, opt, osd, options=StateDictOptions(full_state_dict=True))


def params_in_sync(model: nn.Module) -> bool:
    """True when every rank holds the same parameters (float64 checksums all-gathered)."""
    if not is_dist():
        return True
    v = torch.stack(
        [torch.stack([p.detach().double().sum(), (p.detach().double() ** 2).sum()]) for p in model.parameters()]
    ).flatten()
    v = plain(v)
    out = [torch.zeros_like(v) for _ in range(world_size())]
    tdist.all_gather(out, v)
    return all(torch.equal(out[0], o) for o in out[1:])


def barrier() -> None:
    if is_dist():
        tdist.barrier()


def cleanup() -> None:
    """Wait for every rank (so none exits while others still talk to it), then tear down."""
    if is_dist():
        tdist.barrier()
        tdist.destroy_process_group()
