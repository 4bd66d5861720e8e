"""`rehearse`: every party of a config run as its own process would run it, all in this process, taking turns.

`lvfl launch --rehearse` (and the fast tests) run each party's `lvfl party` exactly as a launch does (its own
LightningCLI, trainer, run folder and view of the protocol: `VFLModule.hold_only`, the datamodule's own exchange),
but each in a thread of this process, their messages in memory (`lvfl.federation.rehearsal.Turns`), one view running
at a time. What a deployment shows only on a busy machine, as a hang or a broken stream, fails here at once and the
same way every time: a message one party's code sends and its receiver's code never takes, a take no message can
satisfy, a message on a link nobody declared (`lvfl.schedule`). Each party's run folder ends as its launched
process's would: bit-identical to `lvfl fit`.

What it does not cover: the sockets (the codec, TLS, the greeting, the orderly end: the launch tests do), and a
party of several ranks (DDP: one view per party).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lvfl.commands.fit import build_cli
from lvfl.commands.launch_parties import config_parties
from lvfl.commands.party import check_deployable, check_party, config_party_names, coordinator_of, put_on_link
from lvfl.federation.rehearsal import TurnLink, Turns
from lvfl.schedule import Links

__all__ = ["RehearsedParty", "rehearse"]


@dataclass
class RehearsedParty:
    """One party's place in a rehearsal: `lvfl party`'s `PartySession`, its transport a view's turns."""

    party: str
    turns: Turns
    transport: Any = field(default=None, init=False)  # set once joined (the fit command's "it talked" test)
    links: Links | None = field(default=None, init=False)

    def join(self, cli: Any) -> None:
        """Refuse what does not deploy, as `lvfl party` does; put the protocol's wire on this party's turns."""
        check_party(self.party, cli.datamodule, coordinator_of(cli.model))
        check_deployable(cli.model, cli.datamodule, cli.trainer)
        self.links = cli.model.declared_links(cli.datamodule, cli.trainer.callbacks)
        put_on_link(cli, self.party, TurnLink(self.turns, self.party))
        self.transport = self.turns

    def holds_no_party(self, datamodule: Any) -> bool:
        """Whether this view is a key holder outside the config's parties (an HE backend's coordinator)."""
        return self.party not in config_party_names(datamodule)

    def finish(self) -> None:
        """Nothing to deliver: `Turns.run` checks, once every view is done, that every message was taken."""

    def abort(self, reason: str) -> None:
        """Stop the other views with `reason`, as a deployed party's abort stops its peers."""
        self.turns.fail(f"{self.party} stopped: {reason}")

    def close(self) -> None:
        """Nothing to close: the views share this process."""


def rehearse(
    args: list[str], save_dir: str | Path | None = None, subcommand: str = "fit", allow_public_seeds: bool = False
) -> dict[str, Any]:
    """Run `lvfl party SUBCOMMAND ARGS` for every party of the config, in this process, in turns; their CLIs by party.

    Each party's logger writes under `save_dir`/<party> (default: the config's save_dir, as `lvfl launch` does).

    Raises:
        lvfl.schedule.ScheduleError: a message never taken, a take with no send, or a link nobody declared.
        Exception: a party's own error (the others stop with it), as `lvfl party` raises it.
    """
    names, _, configured, ranks = config_parties(args, allow_public_seeds, fits=subcommand == "fit")
    if ranks > 1:
        raise ValueError(f"a rehearsal runs one view per party; the config runs each party on {ranks} devices")
    root = Path(save_dir if save_dir is not None else configured or "runs")
    turns = Turns(names)  # the seed check (`allow_public_seeds`) is `config_parties`', above, as `lvfl launch`'s

    def body(name: str) -> Any:
        argv = [subcommand, *args, f"--trainer.logger.init_args.save_dir={root / name}"]
        return build_cli(argv, exit_on_error=False, party=RehearsedParty(name, turns))

    return turns.run({name: (lambda name=name: body(name)) for name in names})
