"""Dropout masks drawn once for a whole forward and replayed chunk by chunk.

A cached contrastive step (``stages.training.cached_step``) runs one forward over R rows as
several chunks, twice: once without gradients, once again with them. Both must see the masks
the unchunked forward would have drawn, or the step computes another update. A ``MaskTape``
makes that so: while the first chunk of its first run records, every dropout site draws the mask
of all R rows (from the same generator, in the same site order, with the same shapes as the
unchunked forward: the same random numbers) and keeps it as bits; every later chunk, and the
replay, takes its rows' slice. A site whose input does not have the chunk's rows as its
first dimension of three or more (DeBERTa's relative-position dropout) is drawn once for the
forward and shared, as the unchunked forward shares it.

The dropout implementations consult the active tape (``stages.modeling.dropout``); nothing
else changes. A forward that draws from the generator outside them (a dropout the tape cannot
see) is caught by the caller, which compares the generator's state around every replayed
chunk.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

# Draws the scaled keep-mask of a training-mode dropout: (shape, p, like) -> mask.
Draw = Callable[[tuple[int, ...], float, torch.Tensor], torch.Tensor]


@dataclass
class _Site:
    shape: tuple[int, ...]  # of all rows (a row site) or as drawn (a shared site)
    p: float
    rows: bool
    keep: torch.Tensor  # a row site's bits, eight to a byte, row by row; a shared site's bools

    def chunk(self, start: int, stop: int) -> torch.Tensor:
        """The keep-mask (bool) of rows [start, stop), or the shared one."""
        if not self.rows:
            return self.keep
        elements = math.prod(self.shape[1:])
        bits = (self.keep[start:stop].unsqueeze(-1) & _BITS.to(self.keep.device)) != 0
        return bits.view(stop - start, -1)[:, :elements].view(stop - start, *self.shape[1:])


# A row's mask is kept as bits: at batch 512 and length 32 a BERT-large's masks are 2.8 GB as
# booleans (7% of the plain step's activations), 0.35 GB as bits.
_BITS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)


def _packed_rows(keep: torch.Tensor) -> torch.Tensor:
    """(rows, ...) booleans as (rows, ⌈n / 8⌉) bytes, each row's bits in order."""
    flat = keep.reshape(keep.shape[0], -1)
    flat = torch.nn.functional.pad(flat, (0, -flat.shape[1] % 8))
    weighted = flat.view(flat.shape[0], -1, 8).to(torch.uint8) * _BITS.to(keep.device)
    return weighted.sum(-1, dtype=torch.uint8)


class MaskTape:
    """The dropout masks of one forward over ``rows`` rows (see the module's docstring)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self._sites: list[_Site] = []
        self._recorded = False
        self._span = (0, rows)
        self._calls = 0

    @property
    def recorded(self) -> bool:
        """Whether the masks are drawn (a chunk has run); from then on chunks only replay."""
        return self._recorded

    @contextmanager
    def chunk(self, start: int, stop: int) -> Iterator[None]:
        """Dropout inside draws (first chunk) or replays the masks of rows [start, stop)."""
        global _ACTIVE
        if _ACTIVE is not None:
            raise RuntimeError("a dropout tape is already playing")
        self._span, self._calls, _ACTIVE = (start, stop), 0, self
        try:
            yield
        finally:
            _ACTIVE = None
        if self._recorded and self._calls != len(self._sites):
            raise RuntimeError(
                f"a chunk's forward applied {self._calls} dropouts, the recorded forward "
                f"{len(self._sites)}: the chunks of one forward must run the same layers"
            )
        self._recorded = True

    def keep_mask(
        self, shape: tuple[int, ...], p: float, like: torch.Tensor, draw: Draw
    ) -> torch.Tensor:
        """The scaled keep-mask (0 or 1 / (1 − p), ``like``'s dtype and device) for a dropout of
        rate ``p`` on a ``shape`` input of the current chunk."""
        start, stop = self._span
        index, self._calls = self._calls, self._calls + 1
        rows = len(shape) >= 3 and shape[0] == stop - start
        if not self._recorded:
            full = (self.rows, *shape[1:]) if rows else tuple(shape)
            keep = draw(full, p, like) != 0
            self._sites.append(_Site(full, p, rows, _packed_rows(keep) if rows else keep))
        if index >= len(self._sites):
            raise RuntimeError(f"a chunk's forward applied more dropouts than the recorded {index}")
        site = self._sites[index]
        expected = (stop - start, *site.shape[1:]) if site.rows else site.shape
        if (rows, tuple(shape), p) != (site.rows, expected, site.p):
            raise RuntimeError(
                f"dropout {index} of a chunk's forward has shape {tuple(shape)} and rate {p}; "
                f"the recorded forward's had {site.shape} and {site.p}"
            )
        keep = site.chunk(start, stop)
        return keep.to(like.dtype).mul_(0.0 if p == 1 else 1 / (1 - p))


_ACTIVE: MaskTape | None = None


def active_tape() -> MaskTape | None:
    """The tape the current forward's dropouts draw from or replay, if any."""
    return _ACTIVE
