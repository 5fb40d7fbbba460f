"""A distributed run whose peer died: what the surviving ranks say instead of the backend's traceback.

When one rank of a DDP/FSDP run is killed (``kill -9``, the OOM killer, a lost node), each other rank
is blocked in a collective; gloo then raises ``Connection closed by peer`` (or reset, broken pipe),
NCCL a remote error, wrapped by autograd and Lightning into a traceback of a hundred lines. The train
app turns it into one line (:func:`rank_lost`): which rank is gone, at which step, what the run's
``last.ckpt`` holds. Its exit status stays 1: the run failed, and no input of this command is wrong.
"""

from __future__ import annotations

import re

from nerf_lightning.errors import StopRun

__all__ = ["RankLost", "lost_peer", "rank_lost"]

#: what gloo and NCCL say when the process at the other end of a collective is gone
_PEER_GONE = re.compile(
    r"(Connection closed by peer|Connection reset by peer|Broken pipe)( \[[^\]]*\]:\d+)?"
    r"|remote process exited or there was a network error|NCCL communicator was aborted"
)


class RankLost(StopRun):
    """Another rank of a distributed run died; this one stopped in the collective it waited in."""

    exit_code = 1


def lost_peer(err: BaseException) -> str | None:
    """The backend's words for a dead peer in ``err`` or the exceptions it chains (None: another error)."""
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, RuntimeError) and (found := _PEER_GONE.search(str(cur))):
            return found.group(0).strip()
        cur = cur.__cause__ or cur.__context__
    return None


def rank_lost(err: BaseException, rank: int, world_size: int, where: str) -> RankLost | None:
    """The one-line stop of rank ``rank`` whose peer is gone (None when ``err`` is no such error).

    ``where``: the step and what the checkpoint holds. Of two ranks the dead one is the other; of more,
    the backend names only its address."""
    words = lost_peer(err)
    if words is None or world_size < 2:
        return None
    who = f"DDP rank {1 - rank} of 2" if world_size == 2 else f"a DDP rank of {world_size}"
    return RankLost(
        f"{who} is gone (its process died or its node was lost; {words}) {where}; this rank ({rank}) "
        "stopped too: see the lost rank's log for why it died"
    )
