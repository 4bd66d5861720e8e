"""`CommunicationMeter`: reports the wire's ledger to every configured logger.

Bytes are counted at the transport (`lvfl.wire`); this callback only reads the protocol's ledger and writes to
the loggers directly (see `lvfl.loggers`: nothing monitors these figures, and `self.log` is costly on tiny steps):

- on the logging cadence during training: `train/comm/bytes` (cumulative, all stages and the key set-up),
  `train/comm/bytes/<tag>` and `train/comm/bytes/<src>_to_<dst>`;
- per training epoch: `train/comm/epoch_bytes` (bytes of training steps only, validation excluded) and its split
  by tag and by link; summed across ranks under DDP;
- once per fresh (not resumed) fit, at the first training epoch: `train/comm/setup_bytes`, everything that crossed
  before the first training step, validation excluded: the key exchange, and the one-shot transfers of protocols
  that move data before training (PraVFed's label release and embedding upload). A cost-to-target figure that
  left it out would flatter exactly those protocols;
- at the end of fit and test: a printed summary (MB = 10^6 bytes).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from lvfl.loggers import is_logging_step, log_to_loggers
from lvfl.wire import Wire

MB = 1e6


def _wire(pl_module: LightningModule) -> Wire:
    wire = getattr(pl_module, "wire", None)
    if not isinstance(wire, Wire):
        raise TypeError(f"CommunicationMeter needs an lvfl protocol with a `wire`; got {type(pl_module).__name__}")
    return wire


def format_summary(wire: Wire, title: str = "communication") -> str:
    """A human-readable table of the ledger: total, per tag and per link, in MB (10^6 bytes)."""
    lines = [f"== {title}: {wire.total_bytes() / MB:.3f} MB in {wire.total_messages()} messages =="]
    tags, links = sorted(wire.bytes_by_tag().items()), sorted(wire.bytes_by_link().items())
    width = max([18, *(len(name) for name, _ in tags + links)])  # a long tag (teacher/...) keeps the columns aligned
    for tag, n in tags:
        lines.append(f"  tag  {tag:<{width}} {n / MB:12.4f} MB {n:>14,d} bytes")
    for link, n in links:
        lines.append(f"  link {link:<{width}} {n / MB:12.4f} MB {n:>14,d} bytes")
    return "\n".join(lines)


class CommunicationMeter(Callback):
    """Logs the bytes crossing between parties, per step and epoch, total, per tag and per link.

    Args:
        per_link: also log per-link figures (one metric per directed link).
        print_summary: print the ledger at the end of fit and test.
    """

    def __init__(self, per_link: bool = True, print_summary: bool = True) -> None:
        self.per_link = per_link
        self.print_summary = print_summary
        self._mark: Counter[tuple[str, str, str]] = Counter()
        self._epoch: Counter[tuple[str, str, str]] = Counter()
        self._setup_pending = False
        self._before_test: dict[str, list] = {}  # the ledger the test's own traffic is counted from
        self._history: dict[str, list] = {}  # the ledger of a loaded checkpoint
        self._fitted = False  # a fit ran in this process (a test after it counts from where it ended)

    # -- train-epoch accounting: deltas of the ledger over training batches only -------------------------------
    def _accumulate(self, wire: Wire) -> None:
        delta = wire.bytes.copy()
        delta.subtract(self._mark)
        self._epoch.update(+delta)
        self._mark = wire.bytes.copy()

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Open the set-up span from an empty ledger (a resumed fit's ledger holds the restored history: no span)."""
        self._setup_pending = trainer.ckpt_path is None
        if self._setup_pending:
            self._mark = Counter()
            self._epoch = Counter()

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Close the set-up span (first epoch of a fresh fit), then start counting this epoch's training bytes."""
        wire = _wire(pl_module)
        if self._setup_pending:
            self._accumulate(wire)
            log_to_loggers(
                trainer,
                self._reduced(trainer, pl_module, self._figures(self._epoch, "train/comm/setup_bytes")),
                epoch=True,
            )
            self._setup_pending = False
        self._mark = wire.bytes.copy()
        self._epoch = Counter()

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Close the training (or set-up) span before validation traffic starts."""
        if trainer.training or (trainer.state.fn == "fit" and (self._setup_pending or not trainer.sanity_checking)):
            self._accumulate(_wire(pl_module))

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Resume the training span after validation."""
        self._mark = _wire(pl_module).bytes.copy()

    def _figures(self, ledger: Counter[tuple[str, str, str]], prefix: str) -> dict[str, float]:
        """`prefix` (total), `prefix/<tag>` and, with `per_link`, `prefix/<src>_to_<dst>` from a ledger."""
        figures: Counter[str] = Counter({prefix: 0})  # a silent epoch still reports its 0 bytes
        for (src, dst, tag), n in ledger.items():
            figures[prefix] += n
            figures[f"{prefix}/{tag}"] += n
            if self.per_link:
                figures[f"{prefix}/{src}_to_{dst}"] += n
        return {k: float(figures[k]) for k in sorted(figures)}  # sorted: the same order on every rank

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Cumulative figures, on Lightning's logging cadence (this rank's ledger)."""
        if is_logging_step(trainer):
            log_to_loggers(trainer, self._figures(_wire(pl_module).bytes, "train/comm/bytes"))

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """This epoch's training bytes (total, per tag, per link), summed over ranks."""
        self._accumulate(_wire(pl_module))
        figures = self._reduced(trainer, pl_module, self._figures(self._epoch, "train/comm/epoch_bytes"))
        log_to_loggers(trainer, figures, epoch=True)

    @staticmethod
    def _reduced(trainer: Trainer, pl_module: LightningModule, figures: dict[str, float]) -> dict[str, float]:
        """`figures` summed over ranks under DDP (every rank must hold the same keys: `_figures` sorts them)."""
        if trainer.world_size <= 1:
            return figures
        values = torch.tensor(list(figures.values()), dtype=torch.float64, device=pl_module.device)
        return dict(zip(figures, trainer.strategy.reduce(values, reduce_op="sum").tolist(), strict=True))

    def _print_summary(
        self, trainer: Trainer, pl_module: LightningModule, title: str, wire: Wire | None = None
    ) -> None:
        wire = _wire(pl_module) if wire is None else wire
        if trainer.world_size > 1:  # every rank simulates all parties on its shard: the deployment's bytes are the sum
            keys = sorted(wire.bytes)
            counts = torch.tensor([[wire.bytes[k], wire.messages[k]] for k in keys], dtype=torch.float64)
            counts = trainer.strategy.reduce(counts.to(pl_module.device), reduce_op="sum").cpu()
            summed = Wire()  # a ledger built through the Wire's own API, never by writing its counters
            rows = [(*key, int(b), int(m)) for key, (b, m) in zip(keys, counts.tolist(), strict=True)]
            summed.load_state_dict({"bytes": [r[:4] for r in rows], "messages": [(*r[:3], r[4]) for r in rows]})
            wire, title = summed, f"{title}, summed over {trainer.world_size} ranks"
        lead = "\n" if trainer.progress_bar_callback is not None else ""  # below a progress bar's last line
        rank_zero_info(lead + format_summary(wire, title))

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Print the ledger."""
        self._fitted = True
        if self.print_summary:
            self._print_summary(trainer, pl_module, "communication during fit (cumulative)")

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        """Keep the loaded run's ledger: what a test in a new process adds to it is the test's own traffic."""
        self._history = dict((checkpoint.get("lvfl") or {}).get("wire") or {})

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Note what the test's own traffic is counted from.

        After a fit in this process: the wire as the test finds it. In a new process (`lvfl test`): the loaded run's
        ledger, so the test's own set-up (the PSI, the split) counts as the test's.
        """
        self._before_test = _wire(pl_module).state_dict() if self._fitted or not self._history else self._history

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Print what the test itself moved, tag by tag, and the run's cumulative figure in one line."""
        if not self.print_summary:
            return
        wire = _wire(pl_module)
        before = Wire()
        before.load_state_dict(self._before_test)
        moved = Wire()  # the ledger's rows grow only: Counter subtraction keeps exactly what the test added
        added = {"bytes": wire.bytes - before.bytes, "messages": wire.messages - before.messages}
        moved.merge_state_dict({kind: [[*k, n] for k, n in rows.items()] for kind, rows in added.items()})
        self._print_summary(trainer, pl_module, "communication during test", wire=moved)
        total = f"{wire.total_bytes() / MB:.3f} MB in {wire.total_messages()} messages"
        if trainer.world_size <= 1 and before.total_bytes():  # (summed over ranks, the test's own table says it)
            rank_zero_info(f"== cumulative, the run's earlier traffic included: {total} ==")

    def state_dict(self) -> dict[str, Any]:
        """The current epoch's partial count, so a mid-epoch resume keeps it."""
        return {"epoch": [[*k, v] for k, v in self._epoch.items()]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore `state_dict`."""
        self._epoch = Counter({(s, d, t): n for s, d, t, n in state_dict.get("epoch", [])})
