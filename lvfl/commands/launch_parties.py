"""The parties of a config as `lvfl launch` needs them, read with LightningCLI: names, active party, logs, ranks.

Its own module because it loads PyTorch and Lightning, which the launcher does not: a warm launch's first party
process reads it (`lvfl.commands.warm_party`), and the launcher only on a cold start or to repeat a refusal.
"""

from __future__ import annotations

from lvfl.commands.config_files import check_public_seeds
from lvfl.commands.fit import build_cli
from lvfl.commands.party import coordinator_of
from lvfl.parties import party_name

__all__ = ["config_parties"]


def config_parties(
    fit_args: list[str], allow_public_seeds: bool = False, fits: bool = True
) -> tuple[list[str], str, str | None, int]:
    """The config's party names, its active party, its logger's save_dir (None: none) and each party's ranks.

    No data is loaded. The ranks are the trainer's processes (`trainer.devices: N` with `strategy: ddp`): every party
    runs as a process group of that many (`lvfl party --devices`).

    Before a fit (`fits`), refuses privacy noise seeded by the config (`check_public_seeds`), before any party starts.
    It loads PyTorch and Lightning (LightningCLI reads the config): a warm launch asks a party process for it.
    """
    config_args, skip = [], False
    own = ("--ckpt_path", "--output", "--ids", "--oblivious")  # the subcommand's own options are not the config's
    for arg in fit_args:
        if skip or arg.split("=", 1)[0] in own:
            skip = arg in own
            continue
        config_args.append(arg)
    cli = build_cli(config_args, run=False, exit_on_error=False)
    participants = getattr(cli.datamodule, "participants", None)
    if participants is None:
        raise ValueError("lvfl launch needs a VerticalDataModule (data:) to know the parties")
    if len(participants) < 2:
        raise ValueError(f"lvfl launch needs at least two parties; the config has {len(participants)}")
    if fits:
        check_public_seeds(cli.model, allow_public_seeds, "lvfl launch")
    logger = cli.trainer.logger
    coordinator = coordinator_of(cli.model)  # an HE backend's key holder runs as a process of its own
    names = [party_name(i) for i in participants] + ([coordinator] if coordinator else [])
    return names, party_name(cli.datamodule.active_party), getattr(logger, "save_dir", None), cli.trainer.world_size
