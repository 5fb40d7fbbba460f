"""What the viewer's keys hold, shared by ``view``'s own keys and ``train viewer=on``'s ``viewer.*``
(``callback.py``): each written once here (``config_schema.py``)."""

from __future__ import annotations

from typing import Annotated

from nerf_lightning.config_schema import Note, Range

__all__ = ["MaxSize", "Port", "PreviewSize"]

#: where the viewer listens
Port = Annotated[int, Range(low=0, high=65535), Note("0: any free port")]
#: longest side of a full frame, px
MaxSize = Annotated[int | None, Range(low=8), Note("px; null: 1024 on a GPU, 256 on the CPU")]
#: longest side while the camera moves, px
PreviewSize = Annotated[int | None, Range(low=8), Note("px; null: 256 on a GPU, 64 on the CPU")]
