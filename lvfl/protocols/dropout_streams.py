"""`DropoutStreams`: every party's dropout draws from that party's own generator, reseeded each epoch.

So that a party's dropout masks depend on the run's seed, the party and the epoch only (not on the other parties'
models), and a party's own process or a resumed run draws the simulation's masks (`lvfl.models.dropout`).
"""

from __future__ import annotations

import torch

from lvfl.models.dropout import PartyGenerator, use_party_generator
from lvfl.runs import derive_seed


class DropoutStreams:
    """Per-party dropout generators, a mixin of `VFLModule` (whose `on_fit_start` calls `use_party_generators`).

    A plain mixin: it relies on these of `VFLModule` (`lvfl.protocols.base`): `_dropout_seed` (the run's dropout
    seed, checkpointed), `_party_generators` (party -> `PartyGenerator`), `built`, `party_names`, `party_models`,
    `active`, and Lightning's `trainer` and `named_children`.
    """

    def use_party_generators(self) -> None:
        """Make every party's dropout draw from that party's own generator (`lvfl.models.dropout`), once.

        Each party's generator is seeded from the run's seed (the global one when the fit starts, kept in the
        checkpoint) and its index, and reseeded at every training epoch (`on_train_epoch_start`), so its masks do not
        depend on the other parties' models, and a party's own process and a resumed run draw the simulation's. The
        active party's generator also serves its other modules (a top model, a private head).
        """
        if self._party_generators or not self.built:
            return
        if self._dropout_seed is None:
            self._dropout_seed = int(torch.initial_seed())
        for index, name in enumerate(self.party_names):
            self._party_generators[name] = PartyGenerator(derive_seed(self._dropout_seed, "dropout", index))
            use_party_generator(self.party_models[name], self._party_generators[name])
        for name, child in self.named_children():
            if name != "party_models":
                use_party_generator(child, self._party_generators[self.active])

    def on_train_epoch_start(self) -> None:
        """Reseed every party's dropout generator for this epoch (from the run's seed, the party and the epoch)."""
        epoch = self.trainer.current_epoch
        for index, name in enumerate(self.party_names):
            if name in self._party_generators:
                self._party_generators[name].reseed(derive_seed(self._dropout_seed or 0, "dropout", index, epoch))
