"""A resumed fit is the run it continues: fit 2 epochs + resume to 4 equals an uninterrupted 4-epoch fit.

Equal means every parameter bit-identical, the same validation metrics per epoch, the same training order per
epoch, and a wire ledger that differs only by the resumed process's own set-up traffic (the aggregation backend's
fresh key exchange), which is kept under `resume/<tag>`.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from helpers import REPO, dh_key_ledger, make_trainer, split_ledger
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from lvfl.callbacks import CommunicationMeter
from lvfl.callbacks.checkpoint import ExactResume
from lvfl.datamodules import Synthetic
from lvfl.datamodules.samplers import EpochShuffle
from lvfl.models import MLP
from lvfl.privacy import DHMasking, Plain
from lvfl.protocols import EASTER, PartyConfig
from lvfl.runs import RESUME_TAG_PREFIX, derive_seed, split_resume_traffic


def tiny_data(seed: int = 0, **kwargs) -> Synthetic:
    """3 parties (2 passive, as DHMasking needs), 5 training batches of 12 samples."""
    args = {"num_samples": 90, "num_features": 6, "num_informative": 4, "num_parties": 3, "batch_size": 12}
    return Synthetic(seed=seed, **{**args, **kwargs})


def dropout_easter(aggregation) -> EASTER:
    """EASTER with dropout in every party model (the global RNG matters) and momentum (optimizer state matters)."""
    party = PartyConfig(
        model=partial(MLP, hidden=[16], dropout=0.3),
        optimizer=partial(torch.optim.SGD, lr=0.1, momentum=0.9),
    )
    return EASTER(parties=[party], aggregation=aggregation, embedding_dim=8)


class Record(Callback):
    """Per epoch: the IDs of every training batch in order and the validation metrics."""

    def __init__(self) -> None:
        self.orders: dict[int, list[int]] = {}
        self.val: dict[int, dict[str, float]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.orders.setdefault(trainer.current_epoch, []).extend(batch.ids.tolist())

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            metrics = trainer.callback_metrics
            self.val[trainer.current_epoch] = {k: float(v) for k, v in metrics.items() if k.startswith("val/")}


def fit(tmp_path: Path, aggregation, epochs: int, seed: int, ckpt_path: str | None = None) -> tuple[EASTER, Record]:
    pl.seed_everything(seed, verbose=False)
    model, record = dropout_easter(aggregation), Record()
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=0)
    trainer = make_trainer(
        tmp_path,
        max_epochs=epochs,
        callbacks=[CommunicationMeter(print_summary=False), ExactResume(), record, checkpoint],
        enable_checkpointing=True,
        num_sanity_val_steps=1,
    )
    trainer.fit(model, datamodule=tiny_data(), ckpt_path=ckpt_path)
    return model, record


# ---------------------------------------------------------------------------------------------------- the sampler
def test_training_order_is_a_function_of_seed_and_epoch():
    dm = tiny_data()

    def order(datamodule, epoch: int) -> list[int]:
        loader = datamodule.train_dataloader()
        assert isinstance(loader.batch_sampler.sampler, EpochShuffle)
        loader.batch_sampler.sampler.set_epoch(epoch)  # what Lightning's fit loop does before each epoch
        return [i for batch in loader for i in batch.ids.tolist()]

    orders = [order(dm, e) for e in range(4)]
    assert all(sorted(o) == sorted(dm.train_set.ids.tolist()) for o in orders), "each epoch is a permutation"
    assert len({tuple(o) for o in orders}) == 4, "a different order every epoch"
    assert [order(dm, e) for e in (3, 1)] == [orders[3], orders[1]], "independent of how many loaders came before"
    assert [order(tiny_data(), e) for e in range(4)] == orders, "the same in a fresh datamodule (another process)"
    assert order(tiny_data(seed=1), 0) != order(tiny_data(seed=1), 1)
    loader = tiny_data().train_dataloader()  # iterated by hand, without set_epoch: epochs 0, 1, ... in turn
    assert [[i for batch in loader for i in batch.ids.tolist()] for _ in range(2)] == orders[:2]
    # the stream an uninterrupted run always drew: one randperm per epoch from Generator().manual_seed(seed)
    generator = torch.Generator().manual_seed(dm.seed)
    perms = [torch.randperm(len(dm.train_set), generator=generator) for _ in range(3)]
    assert orders[2] == dm.train_set.ids[perms[2]].tolist()


def test_derived_seeds_differ_by_purpose_and_words():
    seeds = {derive_seed(s, p, e) for s in (0, 1) for p in ("shuffle", "global_rng", "dropout") for e in (0, 1, 2)}
    assert len(seeds) == 18
    assert all(0 <= s < 2**63 for s in seeds)
    with pytest.raises(ValueError, match="unknown seed purpose"):
        derive_seed(0, "bagging", 1)


def test_epoch_seed_keeps_its_base_seed_across_a_resume(monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    callback = ExactResume()
    callback.on_fit_start(None, None)
    assert callback.base_seed == 7
    restored = ExactResume()
    restored.load_state_dict(callback.state_dict())
    monkeypatch.setenv("PL_GLOBAL_SEED", "8")  # the resumed process was seeded differently
    restored.on_fit_start(None, None)
    assert restored.base_seed == 7
    assert ExactResume(seed=3).state_dict() == {"base_seed": None}


# ---------------------------------------------------------------------------------------------------- fit + resume
@pytest.mark.parametrize("backend", [Plain, DHMasking], ids=["Plain", "DHMasking"])
def test_fit_then_resume_equals_an_uninterrupted_fit(tmp_path, backend):
    first, first_record = fit(tmp_path / "a", backend(), epochs=2, seed=0)
    last = tmp_path / "a" / "ckpt" / "last.ckpt"
    assert last.exists()
    # the resumed process is seeded differently: nothing of the run may depend on it
    resumed, resumed_record = fit(tmp_path / "a", backend(), epochs=4, seed=123, ckpt_path=str(last))
    whole, whole_record = fit(tmp_path / "b", backend(), epochs=4, seed=0)

    # every epoch of the uninterrupted run has its own order, and the resumed epochs repeat them
    assert len({tuple(whole_record.orders[e]) for e in range(4)}) == 4
    assert {**first_record.orders, **resumed_record.orders} == whole_record.orders
    assert sorted(resumed_record.orders) == [2, 3]

    state, expected = resumed.state_dict(), whole.state_dict()
    assert state.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(state[name], value), f"{name} differs after the resume"
    assert {**first_record.val, **resumed_record.val} == whole_record.val
    assert sorted(whole_record.val) == [0, 1, 2, 3]
    assert resumed.mask_step == whole.mask_step

    # the ledger: the uninterrupted run's, plus the resumed process's own set-up under resume/<tag>: the split message
    # again (a fresh process learns its rows of each split anew) and, with DHMasking, a fresh key exchange
    split = split_ledger(resumed.trainer.datamodule)
    assert split, "the datamodule's split is stratified on the labels: the active party sends it"
    for counts in ("bytes", "messages"):
        own, again = split_resume_traffic(getattr(resumed.wire, counts))
        assert own == {k: n for k, n in getattr(whole.wire, counts).items() if n}, counts
        expected = split if backend is Plain else dh_key_ledger(resumed) | split  # Plain sends nothing at set-up
        assert again == (expected if counts == "bytes" else dict.fromkeys(expected, 1))
    tags = resumed.wire.bytes_by_tag()
    assert ("resume/keys" in tags) is (backend is DHMasking)
    assert all(not t.startswith(RESUME_TAG_PREFIX) for t in whole.wire.bytes_by_tag())


@pytest.mark.slow
def test_resume_through_the_cli_equals_an_uninterrupted_run(tmp_path, monkeypatch):
    """`lvfl fit` 1 epoch then `--ckpt_path last` to 2 epochs = `lvfl fit` 2 epochs, with lvfl's default callbacks."""
    from lvfl.commands.fit import build_cli

    monkeypatch.chdir(REPO)

    def run(save_dir: Path, epochs: int, *extra: str):
        return build_cli(
            [
                "fit",
                "--config",
                "configs/easter/wine.yaml",
                f"--trainer.max_epochs={epochs}",
                f"--trainer.logger.init_args.save_dir={save_dir}",
                "--trainer.enable_progress_bar=false",
                *extra,
            ]
        )

    first = run(tmp_path / "a", 1)
    resumed = run(tmp_path / "a", 2, "--ckpt_path=last", "--seed_everything=5")
    whole = run(tmp_path / "b", 2)
    assert first.trainer.current_epoch == 1
    assert resumed.trainer.current_epoch == whole.trainer.current_epoch == 2
    state, expected = resumed.model.state_dict(), whole.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in expected.items())
    own, again = split_resume_traffic(resumed.model.wire.bytes)
    assert own == {k: n for k, n in whole.model.wire.bytes.items() if n}
    assert again == dh_key_ledger(resumed.model) | split_ledger(resumed.datamodule)
