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
