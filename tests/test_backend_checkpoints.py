"""Every aggregation backend survives a checkpoint: `test --ckpt_path` and a resumed fit run after a fresh setup.

Keys are never checkpointed: a new process builds the module, `setup` makes fresh keys, then Lightning loads the
checkpoint (`VFLModule.on_load_checkpoint` -> `aggregation.load_state_dict`). That load must keep the live keys and
must refuse, naming the setting, a checkpoint made with other backend settings than this run's.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import easter, make_trainer

from lvfl.datamodules import Digits
from lvfl.privacy import CKKS, DHMasking, Paillier, Plain

BACKENDS = {
    "Plain": Plain,
    "DHMasking": DHMasking,
    "Paillier": lambda **kw: Paillier(workers=1, **kw),
    "CKKS": CKKS,
}
#: a setting per backend that a later run might change on the command line, and its other value
OTHER_SETTING = {
    "DHMasking": ("frac_bits", 16, 20),
    "Paillier": ("frac_bits", 16, 20),
    "CKKS": ("mask_bound", 2.0**30, 2.0**29),
}


def datamodule() -> Digits:
    return Digits(num_parties=4, batch_size=32)


@pytest.fixture(scope="module", params=list(BACKENDS))
def checkpoint(request, tmp_path_factory):
    """One epoch of two batches under each backend, saved as a checkpoint."""
    name = request.param
    torch.manual_seed(0)
    tmp = tmp_path_factory.mktemp(name)
    model = easter(4, BACKENDS[name]())
    trainer = make_trainer(tmp, max_epochs=1, limit_train_batches=2, limit_val_batches=1)
    trainer.fit(model, datamodule=datamodule())
    path = tmp / "last.ckpt"
    trainer.save_checkpoint(path)
    return name, path, model.mask_step


def test_test_from_checkpoint_after_a_fresh_setup(checkpoint, tmp_path):
    name, path, _ = checkpoint
    model = easter(4, BACKENDS[name]())  # a new process: new module, new backend, keys made in setup
    [results] = make_trainer(tmp_path, limit_test_batches=2).test(model, datamodule=datamodule(), ckpt_path=path)
    assert results
    assert all(math.isfinite(v) for v in results.values())


@pytest.mark.slow
def test_resume_fit_from_checkpoint(checkpoint, tmp_path):
    name, path, saved_step = checkpoint
    model = easter(4, BACKENDS[name]())
    trainer = make_trainer(tmp_path, max_epochs=2, limit_train_batches=2, limit_val_batches=1)
    trainer.fit(model, datamodule=datamodule(), ckpt_path=path)
    assert trainer.current_epoch == 2
    assert trainer.global_step > 0
    assert model.mask_step > saved_step  # the mask counter went on from the checkpoint's, no stream reused


@pytest.mark.parametrize("checkpoint", list(OTHER_SETTING), indirect=True)  # Plain has no settings to differ
def test_checkpoint_with_other_backend_settings_is_refused_naming_them(checkpoint, tmp_path):
    name, path, _ = checkpoint
    key, saved, other = OTHER_SETTING[name]
    model = easter(4, BACKENDS[name](**{key: other}))  # e.g. --model.aggregation.init_args.frac_bits=20
    with pytest.raises(ValueError, match=key) as err:
        make_trainer(tmp_path, limit_test_batches=1).test(model, datamodule=datamodule(), ckpt_path=path)
    assert repr(saved) in str(err.value)
    assert repr(other) in str(err.value)
