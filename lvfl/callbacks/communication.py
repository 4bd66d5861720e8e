"""`CommunicationMeter`: reports the wire's ledger to every configured logger.

Bytes are counted at the transport (`lvfl.wire`); this callback only reads the protocol's ledger and logs:

- on the logging cadence during training: `train/comm/bytes` (cumulative, all stages and the key set-up),
  `train/comm/bytes/<tag>` and `train/comm/bytes/<src>_to_<dst>`;
- per training epoch: `train/comm/epoch_bytes` (bytes of training steps only, validation excluded) and its split
  by tag; summed across ranks under DDP;
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
    for tag, n in sorted(wire.bytes_by_tag().items()):
        lines.append(f"  tag  {tag:<18} {n / MB:12.4f} MB {n:>14,d} bytes")
    for link, n in sorted(wire.bytes_by_link().items()):
        lines.append(f"  link {link:<18} {n / MB:12.4f} MB {n:>14,d} bytes")
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

    # -- train-epoch accounting: deltas of the ledger over training batches only -------------------------------
    def _accumulate(self, wire: Wire) -> None:
        delta = wire.bytes.copy()
        delta.subtract(self._mark)
        self._epoch.update(+delta)
        self._mark = wire.bytes.copy()

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Start counting this epoch's training bytes."""
        self._mark = _wire(pl_module).bytes.copy()
        self._epoch = Counter()

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Close the training span before validation traffic starts."""
        if trainer.training or (trainer.state.fn == "fit" and not trainer.sanity_checking):
            self._accumulate(_wire(pl_module))

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Resume the training span after validation."""
        self._mark = _wire(pl_module).bytes.copy()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Cumulative figures, on Lightning's logging cadence."""
        if not is_logging_step(trainer):
            return
        wire = _wire(pl_module)
        metrics = {"train/comm/bytes": float(wire.total_bytes())}
        metrics.update({f"train/comm/bytes/{t}": float(n) for t, n in wire.bytes_by_tag().items()})
        if self.per_link:
            metrics.update(
                {f"train/comm/bytes/{k.replace('->', '_to_')}": float(n) for k, n in wire.bytes_by_link().items()}
            )
        log_to_loggers(trainer, metrics)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """This epoch's training bytes, summed over ranks."""
        self._accumulate(_wire(pl_module))
        by_tag: Counter[str] = Counter()
        for (_, _, tag), n in self._epoch.items():
            by_tag[tag] += n
        keys = ["total", *sorted(by_tag)]
        values = torch.tensor([float(sum(by_tag.values()))] + [float(by_tag[t]) for t in keys[1:]], dtype=torch.float64)
        values = (
            trainer.strategy.reduce(values.to(pl_module.device), reduce_op="sum") if trainer.world_size > 1 else values
        )
        names = ["train/comm/epoch_bytes" if key == "total" else f"train/comm/epoch_bytes/{key}" for key in keys]
        log_to_loggers(trainer, dict(zip(names, values.tolist(), strict=True)), epoch=True)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Print the ledger."""
        if self.print_summary:
            rank_zero_info(format_summary(_wire(pl_module), "communication during fit (cumulative)"))

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Print the ledger."""
        if self.print_summary:
            rank_zero_info(format_summary(_wire(pl_module), "communication (cumulative, incl. test)"))

    def state_dict(self) -> dict[str, Any]:
        """The current epoch's partial count, so a mid-epoch resume keeps it."""
        return {"epoch": [[*k, v] for k, v in self._epoch.items()]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore `state_dict`."""
        self._epoch = Counter({(s, d, t): n for s, d, t, n in state_dict.get("epoch", [])})
