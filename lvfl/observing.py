"""`WireObserver`: a callback that listens to a protocol's Wire for one fit, and stops listening however the fit ends.

Why one base: an observer left subscribed after a fit (or after one that failed) would keep seeing a reused module's
messages; the audit and the attacks (`lvfl.callbacks.LabelLeakageAudit`, `lvfl.attacks`) share this life cycle.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from lvfl.wire import Wire

__all__ = ["WireObserver"]


class WireObserver(Callback, ABC):
    """Subscribes `observe(src, dst, tag, payload)` to a protocol's wire (`listen`); unsubscribes when the fit ends."""

    def __init__(self) -> None:
        self._wire: Wire | None = None
        self._handle: int | None = None

    @abstractmethod
    def observe(self, src: str, dst: str, tag: str, payload: Any) -> None:
        """Called for every message after it is metered (see `Wire.subscribe`)."""

    def listen(self, pl_module: LightningModule) -> Wire:
        """Subscribe to `pl_module.wire` (once per wire); refuses a module without one, naming this callback."""
        wire = getattr(pl_module, "wire", None)
        if not isinstance(wire, Wire):
            raise TypeError(
                f"{type(self).__name__} needs an lvfl protocol with a `wire`; got {type(pl_module).__name__}"
            )
        if self._wire is not wire:
            self.stop_listening()
            self._wire, self._handle = wire, wire.subscribe(self.observe)
        return wire

    def listening_to(self, wire: Wire) -> bool:
        """Whether this callback is subscribed to `wire` now."""
        return self._wire is wire and self._handle is not None

    def stop_listening(self) -> None:
        """Unsubscribe (idempotent)."""
        if self._wire is not None and self._handle is not None:
            self._wire.unsubscribe(self._handle)
        self._wire, self._handle = None, None

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Stop listening."""
        self.stop_listening()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        """Stop listening when fit fails, so a reused module carries no stale observer."""
        self.stop_listening()
