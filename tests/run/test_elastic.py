"""torchrun restarts through a shared rendezvous store: the run says how to start torchrun instead."""

from __future__ import annotations

from nerf_lightning.run.elastic import restart_hazard


def test_a_restarting_torchrun_with_a_shared_store_is_named() -> None:
    shared = {"TORCHELASTIC_MAX_RESTARTS": "1", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    warning = restart_hazard(shared)
    assert warning is not None and "--max-restarts=1" in warning
    assert warning.endswith("start torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in its environment")
    # torchrun started with the fix hands its workers TORCHELASTIC_USE_AGENT_STORE=False
    assert restart_hazard({**shared, "TORCHELASTIC_USE_AGENT_STORE": "False"}) is None
    assert restart_hazard({**shared, "TORCHELASTIC_MAX_RESTARTS": "0"}) is None  # no restarts
    assert restart_hazard({}) is None  # not under torchrun
