"""torchrun restarts (``--max-restarts``): what a restarted worker group needs from its launcher.

torchrun's c10d rendezvous hands every attempt of the worker group the same TCP store by default
(``TORCHELASTIC_USE_AGENT_STORE=True``), and that store still holds the failed attempt's addresses: a
restarted rank that reads its peer's old address before the peer has written its new one cannot
connect (gloo: ``connectFullMesh ... Connection refused``; NCCL the same; pytorch/pytorch#135712).
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` in torchrun's own environment gives each attempt a store of
its own. The worker cannot change its agent's store, so it says so at the start of the run.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

__all__ = ["FIX_ENV", "restart_hazard"]

log = logging.getLogger(__name__)

#: torchrun's environment variable that gives each restart attempt a store of its own
FIX_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def restart_hazard(env: Mapping[str, str] = os.environ) -> str | None:
    """A warning when this worker's torchrun restarts failed groups through a shared store, else None."""
    try:
        restarts = int(env.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    except ValueError:
        return None
    if restarts <= 0 or env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return (
        f"torchrun --max-restarts={restarts} with its shared rendezvous store: a restarted worker group can "
        f"fail to connect (pytorch/pytorch#135712); start torchrun with {FIX_ENV}=1 in its environment"
    )
