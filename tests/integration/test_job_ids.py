"""A real script under Slurm's variables: its job names the run in the header and the report."""

from __future__ import annotations

import time

from gputop import report
from gputop.model.figures import summarize
from gputop.tui.view import build_view
from tests.support.collectors import snapshot_of, wait_for
from tests.support.processes import needs_torch, run_script

SLURM = {"SLURM_JOB_ID": "48213", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "gpu[01-04]"}


@needs_torch
def test_a_slurm_rank_shows_its_job_in_the_header_and_the_report(collector) -> None:
    code = """
        import torch, gputop
        model = torch.nn.Linear(4, 2)
        gputop.watch(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(5):
            model(torch.randn(2, 4)).sum().backward(); opt.step()
    """
    result = run_script(code, collector.address.port, **SLURM, KUBERNETES_SERVICE_HOST="10.0.0.1",
                         POD_NAME="trainer-0", POD_NAMESPACE="research")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert wait_for(lambda: any(v.status == "done" for v in snapshot_of(collector).all_ranks()))
    snapshot = collector.store.snapshot(time.time(), history=None)
    (view,) = snapshot.all_ranks()
    assert view.run_id.endswith("-slurm48213.0")
    header = build_view(summarize(snapshot)).runs[0].job
    assert header == "slurm 48213.0 on gpu[01-04] · pod research/trainer-0"
    text = report.render(snapshot, "text")
    assert "job: slurm 48213.0 on gpu[01-04] · pod research/trainer-0" in text
    assert '"slurm_job_id": "48213"' in report.render(snapshot, "json")
