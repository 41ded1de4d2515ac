"""nn.DataParallel watched in a real script: the rank reports the GPUs it spreads over."""

from __future__ import annotations

from tests.support.collectors import snapshot_of, wait_for
from tests.support.processes import needs_torch, run_script


@needs_torch
def test_watching_a_data_parallel_model_reports_it(collector) -> None:
    """On a machine without CUDA, DataParallel runs the module as is: one rank, no GPUs, steps counted."""
    code = """
        import torch, gputop
        model = torch.nn.DataParallel(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)))
        gputop.watch(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(6):
            model(torch.randn(8, 4)).sum().backward(); opt.step(); opt.zero_grad()
    """
    result = run_script(code, collector.address.port)
    assert result.returncode == 0, result.stderr
    assert wait_for(lambda: any(v.status == "done" for v in snapshot_of(collector).all_ranks()))
    (view,) = snapshot_of(collector).all_ranks()
    hello = view.hello
    assert hello.data_parallel is True and hello.ddp is False and hello.model_name == "Sequential"
    assert hello.device_uuids is None  # no CUDA: no GPUs to span
    assert view.windows[-1].step_total == 6
