"""`CheckpointState`: what a protocol adds to a Lightning checkpoint, and the check that a checkpoint is this run's.

Lightning saves the party models and optimizers; a protocol also saves the mask step (a nonce), the wire's ledger,
the backend's non-secret state, the label release with its privacy ledger, the best-epoch state, the dropout seed,
and the run fingerprint (`lvfl.runs.run_fingerprint`) by which loading refuses another run's checkpoint.
"""

from __future__ import annotations

import uuid
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from lvfl.runs import check_fingerprint, resume_rows, run_fingerprint


class CheckpointState:
    """The checkpoint hooks a `VFLModule` inherits (a protocol that saves more overrides them and calls `super()`).

    A plain mixin: it relies on these of `VFLModule` (`lvfl.protocols.base`), which sets them up: `mask_step`,
    `wire`, `aggregation`, `label_release`, `party_names`, `built`, the state `_best_epoch`, `_dropout_seed` and
    `_party_generators`, and Lightning's `_trainer`. It keeps its own `_checkpoint_writer`.
    """

    @property
    def run_token(self) -> str:
        """What tells this run from another of the same config: the same at every party, kept across resumes.

        In a party's own process the federation's run ID (the same at every party of the run); in simulation the
        name of the first checkpoint writer (a random name drawn once per run, kept by a resume). `lvfl export`
        writes it into each party's identity (`lvfl.export`), by which serving parties check they serve one run.
        """
        if getattr(self, "_run_token", None) is None:
            link = self.wire.carrier  # a party's process: the link over its Transport (or a rehearsal's turns)
            run_id = getattr(getattr(link, "transport", None), "run_id", None) or getattr(link, "run_id", None)
            if run_id:
                self._run_token = str(run_id)
            else:
                self._run_token = getattr(self, "_checkpoint_writer", None) or uuid.uuid4().hex
        return self._run_token

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Save the mask step, the ledger, the backend's non-secret state (never keys), label release, run fingerprint.

        The label release and its privacy ledger are saved because the release is what spent epsilon: a resume
        reuses it rather than drawing (and spending) again. The fingerprint (`lvfl.runs.run_fingerprint`: protocol,
        backend and label mechanism with their settings, party models, data split with a digest of every split's
        sample IDs) lets `on_load_checkpoint` refuse a checkpoint of another run. `writer` names this module object
        (the same on every rank), so that reloading a checkpoint it wrote itself does not add its ledger twice.
        """
        trainer = self._trainer
        if getattr(self, "_checkpoint_writer", None) is None:
            writer = uuid.uuid4().hex
            if trainer is not None and trainer.world_size > 1:  # every rank dumps the checkpoint: agree on one name
                writer = trainer.strategy.broadcast(writer, src=0)
            self._checkpoint_writer = writer
        datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
        checkpoint["lvfl"] = {
            "mask_step": self.mask_step,
            "wire": self.wire.state_dict(),
            "aggregation": self.aggregation.state_dict(),
            "party_names": self.party_names,
            "label_privacy": self.label_release.state_dict(),
            "run": run_fingerprint(self, datamodule),
            "writer": self._checkpoint_writer,
            "best_epoch": dict(self._best_epoch),
            "dropout_seed": self._dropout_seed,
            "run_token": self.run_token,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Check that the checkpoint belongs to this run, then restore the counter, ledger, backend state and release.

        A checkpoint whose run fingerprint differs from this run's is refused (`lvfl.runs.CheckpointMismatchError`,
        naming what differs): `lvfl test --ckpt_path last` must not test another run's weights. Without a trainer
        with a VerticalDataModule the data split cannot be compared, and before `build` the party models cannot;
        everything else is. Checkpoints without a fingerprint (older lvfl) load with a warning.

        The ledger: a checkpoint this module wrote itself (testing the best epoch after fit) is already part of its
        ledger and is not added again. For a checkpoint of another process (a resume, `lvfl test --ckpt_path last`)
        the saved ledger is added, and what this module sent before loading it (the backend's fresh key set-up) moves
        under the tag `resume/<tag>` (`lvfl.runs.RESUME_TAG_PREFIX`): traffic that really happened again, kept apart,
        so that the ledger without `resume/*` tags is the uninterrupted run's.
        """
        state = checkpoint.get("lvfl")
        if state is None:
            return
        trainer = self._trainer
        saved_run = state.get("run")
        if saved_run is None:
            rank_zero_warn("the checkpoint records no run fingerprint (older lvfl): cannot check it is this run's")
        else:
            datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
            path = getattr(trainer, "ckpt_path", None) if trainer is not None else None
            where = f"checkpoint {path}" if path else "checkpoint"
            check_fingerprint(saved_run, run_fingerprint(self, datamodule), where)
        saved_parties = state.get("party_names")
        if self.built and saved_parties is not None and saved_parties != self.party_names:
            raise ValueError(f"checkpoint has parties {saved_parties}, this run has {self.party_names}")
        # the step counter is a nonce: never move it back (loading an earlier checkpoint into this process, e.g. to
        # test the best epoch after fit, would otherwise reuse masks that already went on the wire)
        self.mask_step = max(self.mask_step, int(state["mask_step"]))
        if state.get("writer") is None or state.get("writer") != getattr(self, "_checkpoint_writer", None):
            own = self.wire.state_dict()
            self.wire.load_state_dict({key: resume_rows(rows) for key, rows in own.items()})
            self.wire.merge_state_dict(state["wire"])
        self.aggregation.load_state_dict(state.get("aggregation", {}))
        if "best_epoch" in state:
            self._best_epoch = dict(state["best_epoch"])
        if state.get("dropout_seed") is not None and not self._party_generators:  # the run's own dropout streams
            self._dropout_seed = int(state["dropout_seed"])
        if state.get("run_token"):
            self._run_token = str(state["run_token"])
        label_state = state.get("label_privacy")
        if label_state is not None:
            self.label_release.load_state_dict(label_state)
