"""The Lightning module's own bookkeeping: loss statistics per optimizer step."""
from jagg_lab.strategies import JaggStrategy
from tests.conftest import make_module, rollout_and_advantages, strategy_gradient


def test_diagnostics_leave_the_logged_loss_statistics_alone():
    module = make_module(num_steps=4)
    rollout, advantages = rollout_and_advantages(module)
    logged = {}
    for every in (0, 1):
        for metric in module.step_metrics.values():
            metric.reset()
        strategy_gradient(module, JaggStrategy(window=2, diagnose_every=every), rollout, advantages)
        logged[every] = {name: (m.update_count, m.compute().item()) for name, m in module.step_metrics.items()}
    assert logged[1] == logged[0]
