"""`Steps`: the protocol's two counters, the message step every message carries and the mask step of each aggregation.

The message step is the protocol's to say, not the transport's: the protocol sets its wire's `step` at every training
batch (`lvfl.wire.Wire.step`, -1 during set-up), the same count at every party, and a party's carrier stamps each
message with it and refuses one of another step. The mask step numbers the aggregations, so that no mask stream is
ever drawn twice; it is checkpointed (`lvfl.protocols.checkpointing`).
"""

from __future__ import annotations

from typing import Any


class Steps:
    """The step counters a `VFLModule` inherits.

    A plain mixin: it relies on these of `VFLModule` (`lvfl.protocols.base`): `wire`, `mask_step`, and Lightning's
    `trainer`.
    """

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Every party is at the same batch of the same fit: the step its messages carry from here."""
        self.wire.step = self.trainer.fit_loop.total_batch_idx

    def next_mask_step(self) -> int:
        """A fresh mask step for each aggregation, so no mask stream is ever reused (it is checkpointed)."""
        step = self.mask_step
        self.mask_step += 1
        return step
