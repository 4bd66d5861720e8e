"""`lvfl party`: one party of a federation as its own process, running the shared config's fit on what it holds.

Every organisation runs the same config with its own party name::

    lvfl party --config C.yaml --party party1 --federation federation.yaml

The process builds the run exactly as `lvfl fit` does (the same LightningCLI, the same protocol file), with one
difference: its protocol's wire is a party view (`lvfl.wire.Wire(here=party, carrier=...)`) over a mutual-TLS
gRPC `Transport`. The protocol's `setup` then keeps only what the party holds (`VFLModule.hold_only`,
`VerticalDataModule.hold_only`), and its own Lightning `Trainer` keeps its own logs and checkpoints.

Before set-up every party greets the peers it talks with (`Transport.hello`, along the run's declared links:
`lvfl.schedule`): the greeting's header carries the run ID and the config's fingerprint (`config_fingerprint`), so a
peer on another run or another config is refused in one line naming the sections that differ. A run ends in order
(`Transport.goodbye`): each party says it is done and waits for its peers' word, so none stops while another may
still send to it, and a message sent and never taken fails the run. A party that stops on an error tells its peers
(`Transport.abort`), which stop at once; a party that dies says nothing, and its peers' deadlines (`--timeout`)
catch it. Either way every party exits non-zero with one line naming what went wrong and, where training stopped
part-way, the checkpoint to resume from.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from lvfl.attacks import Attack, AttackRecord
from lvfl.commands.config_files import (
    ALLOW_PUBLIC_SEEDS_HELP,
    SETUP_TIMEOUT,
    SETUP_TIMEOUT_HELP,
    TABLE_LISTS,
    check_public_seeds,
)
from lvfl.commands.errors import OneLineParser, debug_requested, reported_errors
from lvfl.commands.fit import main as fit_main
from lvfl.commands.warm_start import LAUNCH_STARTED, PARTY_IMPORTED, PARTY_STARTED, SUBCOMMANDS
from lvfl.federation import FederationError
from lvfl.federation.federation_file import load_federation
from lvfl.federation.link import SocketLink
from lvfl.federation.transport import Transport
from lvfl.parties import party_name
from lvfl.privacy import CKKS, DHMasking, Paillier, Plain
from lvfl.schedule import Links
from lvfl.wire import Wire

__all__ = ["PARTY_HELP", "RANK_SECTION", "PartySession", "config_fingerprint", "main", "party_parser"]

#: the greeting fingerprint's last section: this process's rank in its party's process group, ``rank=0of2``
RANK_SECTION = "rank"

#: the trainer settings that change what a run computes: they must be equal at every party (logging, progress bars
#: and checkpoint folders are each party's own)
TRAINER_KEYS = (
    "max_epochs",
    "min_epochs",
    "max_steps",
    "min_steps",
    "limit_train_batches",
    "limit_val_batches",
    "val_check_interval",
    "check_val_every_n_epoch",
    "num_sanity_val_steps",
    "accumulate_grad_batches",
    "precision",
    "gradient_clip_val",
    "gradient_clip_algorithm",
    "deterministic",
)

PARTY_HELP = (
    "usage: lvfl party [fit|validate|test|predict] --party NAME --federation F.yaml [--run_id ID] [--timeout S] "
    "[--setup_timeout S] "
    "[--key PATH] [--listen ADDR] --config C.yaml [lvfl fit options]\n\n"
    "Run one party of a federation: the shared config's fit, on what this party holds, talking to its peers over "
    "mutual-TLS gRPC (docs/two-organisations.md)."
)


def party_parser(prog: str = "lvfl party") -> argparse.ArgumentParser:
    """The options of `lvfl party` itself; every other argument is `lvfl fit`'s."""
    parser = OneLineParser(prog=prog, add_help=False)
    parser.add_argument("--party", required=True, help="this party's name in the federation file and the config")
    parser.add_argument("--federation", required=True, type=Path, help="the federation file (same at every party)")
    parser.add_argument(
        "--run_id",
        default=None,
        help="names the run; every party must give the same (default: derived from the config's fingerprint)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds to wait for a peer's message (or for a peer to come up) before stopping (default 60)",
    )
    parser.add_argument("--setup_timeout", type=float, default=SETUP_TIMEOUT, help=SETUP_TIMEOUT_HELP)
    parser.add_argument("--key", type=Path, default=None, help="its private key (default: <party>.key beside F)")
    parser.add_argument("--listen", default=None, help="the address to bind, when not the federation file's")
    parser.add_argument("--allow_public_seeds", action="store_true", help=ALLOW_PUBLIC_SEEDS_HELP)
    parser.add_argument(
        "--devices",
        type=int,
        default=None,
        help="run this party as a Lightning DDP group of N ranks (--trainer.devices=N --trainer.strategy=ddp); "
        "every party runs as many, rank r paired with rank r of the others, each at its own address in the "
        "federation file",
    )
    return parser


def devices_args(devices: int | None, rest: list[str]) -> list[str]:
    """The `lvfl fit` options `--devices N` stands for: N devices, and the ddp strategy unless one is given."""
    if devices is None:
        return []
    if devices < 1:
        raise ValueError(f"--devices must be at least 1, got {devices}")
    strategy = any(arg.split("=", 1)[0] == "--trainer.strategy" for arg in rest)
    return [f"--trainer.devices={devices}", *([] if strategy or devices == 1 else ["--trainer.strategy=ddp"])]


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def config_fingerprint(config: Mapping[str, Any], rank: int = 0, ranks: int = 1) -> str:
    """A digest per section of what every party must agree on: ``model=...,data=...,seed=...,trainer=...,rank=0of1``.

    `config` is a fit's parsed config (`cli.config["fit"]` as a dict). Logging, progress bars, callbacks and the
    checkpoint to resume from are each party's own and left out, and so are where the party tables lie: a table's
    `path` is resolved against the config file's folder on each party's own disk (`lvfl.commands.config_files`),
    and each party reads only its own. The last section is the greeting process's rank among its party's `ranks`
    (`lvfl party --devices`): rank r talks to rank r of every other party, so a party run with another number of
    ranks, or a federation file that crosses them, is refused in one line naming both ranks.
    """
    trainer = config.get("trainer") or {}
    digests = ",".join(
        f"{name}={_digest(value)}"
        for name, value in (
            ("model", config.get("model")),
            ("data", _without_table_paths(config.get("data"))),
            ("seed", config.get("seed_everything")),
            ("trainer", {k: trainer.get(k) for k in TRAINER_KEYS}),
        )
    )
    return f"{digests},{RANK_SECTION}={rank}of{ranks}"


def _without_table_paths(data: Any) -> Any:
    """The data section with each party table's `path` left out (`lvfl.commands.config_files.TABLE_LISTS`)."""
    init = data.get("init_args") if isinstance(data, Mapping) else None
    if not isinstance(init, Mapping):
        return data
    tables = {
        key: [{k: v for k, v in t.items() if k != "path"} if isinstance(t, Mapping) else t for t in init[key]]
        for key in TABLE_LISTS
        if isinstance(init.get(key), list)
    }
    return {**data, "init_args": {**init, **tables}}


class SetupReport(Callback):
    """Prints, at a party's first training step, how long its set-up took and where the time went.

    The phases, each from the wall clock of this machine: the launcher's own work before it started this party (its
    config, the certificates: `lvfl launch` only), this process's start and imports, the config and the greetings
    (`PartySession.join`), then the data, the PSI, the keys and the models up to the first step. A party started warm
    (`lvfl.commands.warm_start`) began before the launcher read the config: its report has the launcher's start,
    the imports, then the wait for its part (the config, which this process or another read, and the certificates).
    """

    def __init__(self, marks: Mapping[str, float]) -> None:
        self.marks = dict(marks)
        self.done = False

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Once, at the first step of the fit (a resumed fit's first step too)."""
        if self.done:
            return
        self.done = True
        if trainer.global_rank != 0:  # a party of several ranks reports once
            return
        print(setup_line({**self.marks, "first step": time.time()}), flush=True)


def setup_line(marks: Mapping[str, float]) -> str:
    """``lvfl party: set-up took 9.1 s before the first step: ...`` from the times of the phases' ends."""
    warm = "given its part" in marks
    names = {
        "party started": "the launcher's start" if warm else "the launcher (config, certificates)",
        "imported": "process start and imports",
        "given its part": "waiting for its part (config, certificates)",
        "joined": "config and greetings",
        "first step": "data, PSI, keys and models",
    }
    order = [name for name in ("launch started", *names) if name in marks]
    parts = [f"{names[b]} {marks[b] - marks[a]:.1f} s" for a, b in zip(order, order[1:], strict=False)]
    total = marks["first step"] - marks[order[0]]
    return f"lvfl party: set-up took {total:.1f} s before the first step: " + "; ".join(parts)


@dataclass
class PartySession:
    """One party's place in a federation: who it is, the federation file, and its transport once joined."""

    party: str
    federation: Path
    run_id: str | None = None
    timeout: float = 60.0
    key: Path | None = None
    listen: str | None = None
    allow_public_seeds: bool = False
    setup_timeout: float = SETUP_TIMEOUT  # how long set-up messages may take while their sender is up
    transport: Any = field(default=None, init=False)
    links: Links | None = field(default=None, init=False)  # the run's declared links, once joined
    marks: dict[str, float] = field(default_factory=dict)  # set-up's phases: when each ended (`SetupReport`)

    def join(self, cli: Any) -> None:
        """Start this party's transport, greet every peer, and put the protocol's wire on it (before fit)."""
        subcommand = cli.config.get("subcommand") or "fit"
        config = cli.config.get(subcommand, cli.config)
        config = config.as_dict() if hasattr(config, "as_dict") else dict(config)
        names = check_party(self.party, cli.datamodule, coordinator_of(cli.model))
        check_deployable(cli.model, cli.datamodule, cli.trainer)
        if subcommand == "fit":  # where the noise is drawn
            check_public_seeds(cli.model, self.allow_public_seeds, "lvfl party")
        federation = load_federation(self.federation)  # read once: it loads and checks the file
        known = list(federation.parties)
        missing = [n for n in names if n not in known]
        if missing:
            raise FederationError(
                f"the config's parties {missing} are not in the federation file {self.federation} (it has {known})"
            )
        # derived from what every rank of every party shares (the config's sections, as rank 0 of 1 puts them)
        run_id = self.run_id or "run-" + hashlib.sha256(config_fingerprint(config).encode()).hexdigest()[:12]
        rank, ranks = process_group_rank(cli.trainer, cli.model, self.listen)
        fingerprint = config_fingerprint(config, rank, ranks)
        self.transport = Transport(
            self.party,
            federation.for_rank(rank, ranks),
            run_id,
            key_path=self.key,
            timeout=self.timeout,
            fingerprint=fingerprint,
            listen=self.listen,
        ).start()
        # who talks to whom is the run's one declaration (`lvfl.schedule`: the protocol's star, its backend's
        # coordinator, a callback's links such as the student's producer), which the simulation checks every message
        # against: this party greets the peers it talks with both ways, and takes the messages of those that only send
        # to it (an HE coordinator's public key, another passive party's predictions for the producer) without a
        # greeting; it expects them before any greeting, as they may send as soon as they are greeted by another
        self.links = cli.model.declared_links(cli.datamodule, cli.trainer.callbacks)
        self.transport.expect(self.links.expected(self.party))
        # a peer may come up late (another organisation starts it later; a loaded machine imports for a minute):
        # the greeting waits for it as set-up messages do (`--setup_timeout`)
        self.transport.hello(self.links.greeted(self.party), patience=self.setup_timeout - self.timeout)
        put_on_link(cli, self.party, SocketLink(self.transport, setup_patience=self.setup_timeout - self.timeout))
        self.marks["joined"] = time.time()
        cli.trainer.callbacks.append(SetupReport(self.marks))

    def holds_no_party(self, datamodule: Any) -> bool:
        """Whether this process is a key holder outside the config's parties (an HE backend's coordinator)."""
        return self.party not in config_party_names(datamodule)

    def abort(self, reason: str) -> None:
        """Tell the peers this party stops, and why."""
        if self.transport is not None:
            self.transport.abort(reason)

    def finish(self) -> None:
        """End in order (`Transport.goodbye`): deliver what is queued, tell the peers it is done, wait for their word.

        No party stops its server while a peer may still send to it, and every message a peer sent must have been
        taken here. A peer that is gone once this party's work is done is no error: it is said, on standard error.
        """
        if self.transport is None:
            return
        if self.links is None:  # joined without a declaration (never, through `join`): deliver what is queued
            self.transport.flush()
            return
        me = self.party
        gone = self.transport.goodbye(
            self.links.receivers_from(me), self.links.senders_to(me), patience=self.setup_timeout - self.timeout
        )
        for peer in gone:
            print(f"lvfl party: {peer} was gone before it said it was done; {me}'s part is complete", file=sys.stderr)

    def close(self) -> None:
        """Close the transport (idempotent)."""
        if self.transport is not None:
            self.transport.close()


def check_party(party: str, datamodule: Any, coordinator: str | None = None) -> list[str]:
    """The run's party names, an HE backend's `coordinator` last; refuses a `--party` that is not one of them."""
    names = config_party_names(datamodule) + ([coordinator] if coordinator else [])
    if party not in names:
        raise ValueError(f"--party {party}: the config's parties are {names}")
    return names


def put_on_link(cli: Any, party: str, link: Any) -> None:
    """Make the protocol's wire `party`'s view over `link` (sockets, or a rehearsal's turns); the protocol steps it."""
    cli.model.wire = Wire(here=party, carrier=link)


def process_group_rank(trainer: Any, model: Any = None, listen: str | None = None) -> tuple[int, int]:
    """(this process's rank, the party's ranks): a party run as a Lightning DDP group (`--devices N`) has N.

    Each rank is a process of its own, started by Lightning's launcher (which runs this command again); the set-up
    and the steps of rank r pair with rank r of every other party, and gradients are reduced inside the party only.
    Refused: a strategy that starts its ranks otherwise (`ddp_spawn` would pickle the transport), several nodes, and
    `--listen` (one address: each rank listens at its own, from the federation file).
    """
    ranks = int(getattr(trainer, "world_size", 1))
    if ranks == 1:
        return 0, 1
    strategy = trainer.strategy
    launcher = type(getattr(strategy, "launcher", None)).__name__
    if type(strategy).__name__ != "DDPStrategy" or launcher != "_SubprocessScriptLauncher":
        raise ValueError(
            f"lvfl party runs a party of several devices (--devices {ranks}) with --trainer.strategy=ddp only, "
            f"each rank a process Lightning starts; got {type(strategy).__name__} (launcher {launcher})"
        )
    if int(getattr(trainer, "num_nodes", 1)) != 1:
        raise ValueError(
            f"lvfl party runs a party's ranks on one machine: --trainer.num_nodes 1, not {trainer.num_nodes}"
        )
    coordinator = coordinator_of(model)
    if coordinator is not None:
        raise ValueError(
            f"lvfl party runs a party of several devices (--devices {ranks}) with the Plain and DHMasking backends; "
            f"{coordinator} (the HE backend's key holder) holds no model to run on several devices: use --devices 1"
        )
    if listen is not None:
        raise ValueError(
            f"--listen {listen}: a party of {ranks} ranks listens at each rank's address in the federation file "
            "(address: [host:port, ...]); leave --listen out"
        )
    return int(trainer.global_rank), ranks


def config_party_names(datamodule: Any) -> list[str]:
    """The config's party names, from its datamodule's participants (no data is loaded)."""
    participants = getattr(datamodule, "participants", None)
    if participants is None:
        raise ValueError("lvfl party needs a VerticalDataModule (data:) to know the parties")
    return [party_name(i) for i in participants]


def coordinator_of(model: Any) -> str | None:
    """The name of the model's backend's key holder (an HE backend's coordinator), or None."""
    return getattr(getattr(model, "aggregation", None), "coordinator", None)


def check_deployable(model: Any, datamodule: Any, trainer: Any) -> None:
    """Refuse, by name, what does not run across processes yet (docs/two-organisations.md), before anything moves.

    Run by every party in its own process. What runs: every protocol with the Plain, DHMasking, Paillier and CKKS
    backends (an HE backend's coordinator a process of its own; with `PartyTables` the active party tells it the row
    counts, `add_key_holder`) and any label mechanism (the release is drawn at the active party), the embedded and
    paper datasets and `PartyTables` (its set-up exchanged live, `exchange_on`), the student with its plain channel,
    and `predict --oblivious`, and an attack (`lvfl.attacks.Attack`: label attacks and the embedding inversion) in its
    party's own process, its side knowledge a file in that party's hands (`side_knowledge`), its guesses written
    there and scored afterwards by `lvfl attack-score`. Not yet: the student's Paillier channel and `cross_fit`, the
    backdoors and GRN (they measure themselves in the run), and the leakage audit (it reads every party's messages
    and the labels in one process).
    """
    backend = type(model.aggregation).__name__
    if not isinstance(model.aggregation, Plain | DHMasking | Paillier | CKKS):
        raise ValueError(f"lvfl party runs the Plain, DHMasking, Paillier and CKKS backends; {backend} does not run "
                         "across processes (use lvfl fit)")  # fmt: skip
    private_rows = not getattr(datamodule, "rows_are_public", True)
    if coordinator_of(model) is not None and private_rows and not hasattr(datamodule, "add_key_holder"):
        raise ValueError(
            f"lvfl party runs {backend}'s coordinator with the embedded and paper datasets and PartyTables; "
            f"{type(datamodule).__name__} (the parties' own rows) cannot tell it the row counts (use lvfl fit)"
        )
    if not getattr(datamodule, "rows_are_public", True) and not hasattr(datamodule, "exchange_on"):
        raise ValueError(
            f"lvfl party does not run {type(datamodule).__name__} (the parties' own rows, aligned without a live "
            "exchange) across processes (use lvfl fit)"
        )
    for callback in trainer.callbacks:
        name = type(callback).__name__
        if isinstance(callback, Attack):  # runs in its party's own process; scored afterwards (lvfl attack-score)
            if (callback.known_labels or callback.known_features) and callback.side_knowledge is None:
                raise ValueError(
                    f"lvfl party runs {name} in its party's process, where its side knowledge (known_labels, "
                    "known_features) must be a file in that party's hands: give it side_knowledge (a CSV; a simulated "
                    f"run writes the one it drew to attacks/{callback.metric_name}.known.csv), or set them to 0"
                )
            continue
        if name == "LabelLeakageAudit" or isinstance(callback, AttackRecord):
            # a backdoor measures itself on the validation labels, GRN on the victim's features, inside the run:
            # truth no single process holds (a label attack writes its guesses instead, scored afterwards)
            raise ValueError(f"lvfl party does not run the {name} callback yet (use lvfl fit)")
        if name == "StudentDistillation":
            channel = type(callback.channel).__name__
            if channel != "PlainSoftLabels" or callback.cross_fit is not None:
                what = f"its {channel} channel" if channel != "PlainSoftLabels" else "cross_fit"
                raise ValueError(
                    f"lvfl party runs StudentDistillation with the PlainSoftLabels channel and no cross_fit; {what} "
                    "does not run across processes yet (use lvfl fit)"
                )


_LAUNCH_MARKS = {"launch started": LAUNCH_STARTED, "party started": PARTY_STARTED, "imported": PARTY_IMPORTED}


def main(argv: list[str]) -> None:
    """`lvfl party`: parse its own options, then run `lvfl fit` with the rest as this party (`fit.main`)."""
    imported = time.time()  # this module's imports (torch, Lightning, lvfl) are done; warm: its part was given
    if not argv or argv[0] in ("-h", "--help"):
        print(PARTY_HELP, end="\n\n")
        print(party_parser().format_help().split("\n\n", 1)[1])  # argparse's own usage block, whole lines
        return
    debug, argv = debug_requested(argv)
    subcommand = argv.pop(0) if argv and argv[0] in SUBCOMMANDS else "fit"
    with reported_errors(debug):
        if argv and argv[0] in ("export", "bench"):
            how = {
                "export": "a party exports its own folder from its own checkpoint with lvfl export --party NAME",
                "bench": "lvfl bench runs its grids in one process",
            }[argv[0]]
            raise ValueError(f"lvfl party runs {'/'.join(SUBCOMMANDS)}; {how}")
        own, rest = party_parser().parse_known_args(argv)
        if not own.timeout > 0:
            raise ValueError(f"--timeout must be a positive number of seconds, got {own.timeout}")
        if not own.setup_timeout >= own.timeout:
            raise ValueError(f"--setup_timeout must be at least --timeout ({own.timeout:g} s), got {own.setup_timeout}")
        devices_args(own.devices, rest)  # checked here, in one line
    session = PartySession(
        own.party, own.federation, own.run_id, own.timeout, own.key, own.listen, own.allow_public_seeds,
        setup_timeout=own.setup_timeout,
    )  # fmt: skip
    session.marks = {name: float(os.environ[var]) for name, var in _LAUNCH_MARKS.items() if var in os.environ}
    session.marks["given its part" if "imported" in session.marks else "imported"] = imported  # warm: imported before
    fit_main([subcommand, *rest, *devices_args(own.devices, rest), *(["--debug"] if debug else [])], party=session)
