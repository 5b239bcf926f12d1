"""Every sampler draws its noise on the model's device: run on ``meta`` (standing in for a GPU)
with :class:`~replaid.training.syncs.SyncCounter`, a CPU generator must never fill a device
tensor (which raises on a GPU) and no noise may be drawn on the host and copied over."""

import pytest
import torch

from replaid.config import ModelConfig
from replaid.methods import Kind
from replaid.methods.replaid import DiffusionOptions
from replaid.model.replaid import RePlaid
from replaid.sampling.continuous import gamma_grid, prefix_inpaint
from replaid.sampling.registry import samplers_of
from replaid.training.syncs import SyncCounter, meta_as_cpu_autocast

META = torch.device("meta")


@pytest.fixture(autouse=True)
def _meta_autocast():
    with meta_as_cpu_autocast():
        yield


@pytest.mark.parametrize("inpaint", [False, True])
@pytest.mark.parametrize("name", sorted(samplers_of(Kind.CONTINUOUS)))
def test_continuous_samplers_draw_on_the_device(name, inpaint):
    torch.manual_seed(0)
    model = RePlaid(ModelConfig(hidden=32, n_layers=1, n_heads=2, cond_dim=8, d_e=4), DiffusionOptions(), 23)
    gammas = gamma_grid(model.schedule, 3)
    model = model.to(META).eval()
    ip = prefix_inpaint(torch.zeros(2, 3, dtype=torch.long, device=META), 6, model.embedding()) if inpaint else None
    with torch.no_grad(), SyncCounter("meta") as c:
        res = samplers_of(Kind.CONTINUOUS)[name].fn(
            model, torch.randn(2, 6, 4, device=META), gammas, generator=torch.Generator().manual_seed(0), inpaint=ip
        )
    assert res.tokens.device.type == "meta"
    assert not c.host_random and not c.copies, (dict(c.host_random), dict(c.copies))


# the discrete samplers' device test runs for every registered method in test_method_contract.py
