"""train.compile: RePlaid's loss core (all of Algorithm 1 but the noise draws and the schedule with its
variance hook) compiles as one graph, and the compiled step equals the eager one; on the ``device``
fixture's device (``pytest --device cuda``: Inductor's GPU code)."""

import pytest
import torch

from replaid.training.testbed import eager_and_compiled, loss_core_inputs


def test_loss_core_has_no_graph_break(device):
    """(Plaid shares the core.) Before: the whole TrainModule broke at the CPU generators, the hook's
    in-place weight and RePlaid.forward's nonzero; only the backbone compiled."""
    import torch._dynamo as dynamo

    m, _, args = loss_core_inputs("replaid", device)
    ex = dynamo.explain(m.loss_core)(*args)
    assert ex.graph_break_count == 0 and ex.graph_count == 1, [str(b.reason)[:200] for b in ex.break_reasons]


@pytest.mark.slow
def test_compiled_core_matches_eager_values_and_gradients(device):
    m, model, args = loss_core_inputs("replaid", device)
    (le, ge, _), (lc, gc, _) = eager_and_compiled(m.loss_core, model, args)
    torch.testing.assert_close(le, lc, rtol=1e-5, atol=1e-6)
    for k in ge:
        torch.testing.assert_close(ge[k], gc[k], rtol=1e-3, atol=1e-5, msg=k)


def _token_method(name: str):
    """(method, model, tokens) for a token-network method (AR, MDLM, Duo) at the loss core's sizes."""
    from replaid.methods import get_method
    from replaid.presets import resolve
    from replaid.training.testbed import LOSS_CORE_SIZES

    cfg = resolve("debug", None, [f"method={name}", *LOSS_CORE_SIZES[:-1]])  # no schedule network
    torch.manual_seed(0)
    m = get_method(cfg)
    model = m.build_model(64)
    for p in model.parameters():  # the zero-initialised head and AdaLN gates: values, so gradients reach every layer
        torch.nn.init.normal_(p, std=0.2) if p.dim() > 1 else None
    return m, model, torch.randint(0, 64, (8, 16), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", ["ar", "mdlm", "duo"])
def test_what_each_token_method_compiles_has_no_graph_break(name):
    """``train.compile`` on AR, MDLM and Duo compiles the backbone (Method.compile): traced with the
    arguments of a real training step, it is one graph without a break."""
    import torch._dynamo as dynamo

    m, model, tok = _token_method(name)
    seen: list = []
    h = model.backbone.register_forward_pre_hook(lambda mod, args, kw: seen.append((args, kw)), with_kwargs=True)
    m.train_loss(model, tok, torch.Generator().manual_seed(0))
    h.remove()
    args, kw = seen[0]
    ex = dynamo.explain(model.backbone)(*args, **kw)
    assert ex.graph_break_count == 0 and ex.graph_count == 1, [str(b.reason)[:200] for b in ex.break_reasons]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ar", "mdlm", "duo"])
def test_each_token_method_compiled_equals_eager(name):
    """The training loss and every gradient with ``Method.compile`` applied (Inductor's CPU code) equal
    the eager step's, the same draws (float32: rtol 1e-5 on the loss, 1e-4 on the gradients)."""
    from replaid.training.testbed import grads

    m, model, tok = _token_method(name)
    out = []
    for compiled in (False, True):
        if compiled:
            m.compile(model)
        model.zero_grad(set_to_none=True)
        loss, _ = m.train_loss(model, tok, torch.Generator().manual_seed(0))
        loss.backward()
        out.append((loss.detach(), grads(model)))
    (le, ge), (lc, gc) = out
    torch.testing.assert_close(le, lc, rtol=1e-5, atol=1e-6)
    assert ge.keys() == gc.keys() and len(ge) > 4
    for k in ge:
        torch.testing.assert_close(ge[k], gc[k], rtol=1e-4, atol=1e-6, msg=k)


def test_train_compile_is_on_for_cuda_only_by_default_and_old_configs_keep_theirs(tmp_path):
    """``train.compile=auto`` (the default) compiles on CUDA and leaves the CPU eager; ``on``/``off`` say so on
    any device; a stored bool (before ``auto``) reads as ``on``/``off``; anything else is one line."""
    import json

    from replaid.config import ConfigError, RunConfig, apply_dict, read_run_config
    from replaid.presets import resolve
    from replaid.training.train import compiles

    assert RunConfig().train.compile == "auto"
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert compiles("auto", cuda) and not compiles("auto", cpu)
    assert compiles("on", cpu) and not compiles("off", cuda)
    d = RunConfig().to_dict()
    for old, new in ((True, "on"), (False, "off")):
        d["train"]["compile"] = old  # a stored run's, a grid's planned config, a --config file's
        assert RunConfig.from_dict(d).train.compile == new
        cfg = RunConfig()
        apply_dict(cfg, {"train": {"compile": old}})
        assert cfg.train.compile == new
        assert resolve("debug", None, [f"train.compile={str(old).lower()}"]).train.compile == new  # an override
        path = tmp_path / f"config-{old}.json"  # a run's config.json (or a grid's planned config) of before "auto"
        path.write_text(json.dumps(d))
        assert read_run_config(path).train.compile == new
    with pytest.raises(ConfigError, match="train.compile: must be auto .*, on or off, got 'yes'"):
        resolve("debug", None, ["train.compile=yes"]).validate()
