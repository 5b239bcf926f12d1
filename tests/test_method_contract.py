"""The method contract (``replaid.methods``), every method, on the ``device`` fixture's device
(``pytest --device cuda`` runs it on a GPU): ``build_model``; ``train_loss`` gives a finite scalar with
device-side metrics and finite gradients; ``eval_bound`` gives finite per-sequence nats; the method's
sampler returns in-range tokens on the device; ``state_dict`` round-trips; one ``Trainer.train_step``
(bf16 autocast on CUDA, ``train.precision=auto``) logs a finite loss. Tiny models: a few seconds on a CPU."""
import pytest
import torch

from replaid.methods import METHODS, get_method
from replaid.presets import resolve
from replaid.training.train import EMA, Trainer, TrainModule, build_optimizer

V, B, L = 40, 4, 12
TINY = ["model.hidden=32", "model.n_layers=1", "model.n_heads=2", "model.cond_dim=16", "diffusion.schedule_hidden=16",
        "eval.t_samples=2", f"data.seq_len={L}", f"train.batch_size={B}"]
CONTINUOUS = ("replaid", "plaid")


def setup(name: str, device: torch.device):
    cfg = resolve("debug", None, [f"method={name}", *TINY, f"train.device={device.type}"])
    torch.manual_seed(0)
    method = get_method(cfg)
    model = method.build_model(V).to(device)
    tokens = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(1)).to(device)
    return cfg, method, model, tokens


@pytest.mark.parametrize("name", sorted(METHODS))
def test_train_loss_and_gradients(name, device):
    _, method, model, tokens = setup(name, device)
    loss, metrics = method.train_loss(model, tokens, torch.Generator().manual_seed(2))
    assert loss.ndim == 0 and loss.device == tokens.device and torch.isfinite(loss), loss
    for k, v in metrics.items():
        if torch.is_tensor(v):
            assert v.device == tokens.device and torch.isfinite(v).all(), (k, v)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.device == tokens.device and torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0


@pytest.mark.parametrize("name", sorted(METHODS))
def test_eval_bound_per_sequence(name, device):
    _, method, model, tokens = setup(name, device)
    model.eval()
    out = method.eval_bound(model, tokens, torch.Generator().manual_seed(3))
    assert out, "eval_bound returned nothing"
    for k, v in out.items():
        assert v.shape == (B,) and v.device == tokens.device and torch.isfinite(v).all(), (k, v)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_sampler_on_the_device(name, device):
    _, method, model, _ = setup(name, device)
    model.eval()
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        if name in CONTINUOUS:
            from replaid.diffusion.samplers import gamma_grid, get_sampler

            z = torch.randn(B, L, model.d_e, generator=g).to(device)
            res = get_sampler("ddpm")(model, z, gamma_grid(model.schedule, 3), generator=g)
            tokens, nfe = res.tokens, res.nfe
        elif name == "ar":
            tokens, nfe = method.sample(model, B, L, g)
        else:
            tokens, nfe = method.sample(model, B, L, 3, g)
    assert tokens.shape == (B, L) and tokens.dtype == torch.long and tokens.device.type == device.type
    assert int(tokens.min()) >= 0 and int(tokens.max()) < V and nfe > 0


@pytest.mark.parametrize("name", sorted(METHODS))
def test_state_dict_round_trip_and_a_train_step(name, device):
    cfg, method, model, tokens = setup(name, device)
    tr = Trainer(cfg, model, method, build_optimizer(model, cfg.optim), device, EMA(model, 0.9),
                 loss_module=TrainModule(model, method))
    out = tr.train_step([{"tokens": tokens.cpu()}], log=True)
    assert out["skipped"] == 0 and torch.isfinite(torch.tensor(float(out["loss"]))), out
    state = method.state_dict()
    other = get_method(cfg)
    other.load_state_dict(state)
    assert repr(other.state_dict()) == repr(state)
