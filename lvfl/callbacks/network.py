"""`NetworkSimulator`: how long a run would take over real links, from the messages it sent and the compute it did.

The callback watches the protocol's wire (`Wire.subscribe`) and the clock. Every training step becomes a schedule:
the messages in the order they were sent, each with the wall time the process spent since the previous one (the
sender's compute), and the step's tail after the last message. `lvfl.network.simulate` replays it over the parties'
link profiles and device classes (the model and what it ignores are in `lvfl.network`). Messages outside training
steps (the key exchange and PSI at set-up, one-shot transfers such as PraVFed's uploads) are replayed as phases of
their own and count towards the simulated wall time; validation and test traffic does not (as in
`CommunicationMeter`'s epoch bytes).

Logged to every logger (`lvfl.loggers`), in seconds:

- per step, on the logging cadence: `sim/comm_time` (the schedule with no compute), `sim/step_time` (with the
  measured compute, scaled per device class) and `sim/wall_time` (cumulative simulated time of the fit so far);
- per training epoch: `sim/epoch_time`, `sim/epoch_comm_time` and `sim/wall_time`; once, `sim/setup_time`.

With `keep_trace: true` every phase is kept (`trace`), so `replay` can time the same run under other profiles
without rerunning it (benchmarks/perf/network.py sweeps bandwidths and latencies that way).

Example config (a low-performance device at party3, the others on 100 Mbps / 10 ms links)::

    trainer:
      callbacks:
        - class_path: lvfl.callbacks.NetworkSimulator
          init_args: {links: 100mbps_10ms, devices: {party3: low}}
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from lvfl.loggers import is_logging_step, log_to_loggers
from lvfl.network import DEVICE_CLASSES, LINK_PRESETS, DeviceClass, LinkProfile, Message, simulate
from lvfl.wire import Wire, payload_nbytes

__all__ = ["NetworkSimulator", "Phase"]

LinkSpec = str | Mapping[str, float] | LinkProfile


@dataclass(frozen=True)
class Phase:
    """A replayable piece of a run: a training step ("step") or the messages between steps ("setup", "between")."""

    kind: str
    schedule: tuple[Message, ...]
    tail_s: float
    epoch: int


def link_profile(spec: LinkSpec, where: str) -> LinkProfile:
    """A `LinkProfile` from a preset name, a mapping of its fields, or a profile; errors name `where`."""
    if isinstance(spec, LinkProfile):
        return spec
    if isinstance(spec, str):
        if spec not in LINK_PRESETS:
            raise ValueError(f"{where}: unknown link preset {spec!r}; presets: {sorted(LINK_PRESETS)}")
        return LINK_PRESETS[spec]
    if isinstance(spec, Mapping):
        try:
            return LinkProfile(**dict(spec))
        except TypeError as err:
            raise ValueError(f"{where}: {err}; a link has up_mbps, down_mbps, latency_ms and jitter_ms") from None
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
    raise ValueError(f"{where}: a link is a preset name or {{up_mbps, down_mbps, latency_ms}}, got {spec!r}")


class NetworkSimulator(Callback):
    """Simulated communication and step times of the run over per-party links (see the module docstring).

    Args:
        links: every party's access link: a preset name (`lvfl.network.LINK_PRESETS`) or {up_mbps, down_mbps,
            latency_ms, jitter_ms}; or a mapping from party name to one of those, with `default` for the others.
        devices: per party, a device class (`lvfl.network.DEVICE_CLASSES`: "high", "low"), which sets its link and
            how much slower it computes; a party may not also have its own entry in `links`.
        seed: seeds the jitter draws (only used when a link has jitter).
        keep_trace: keep every phase's schedule in `trace` for `replay`.
        print_summary: print the simulated times at the end of fit.
        message_ms: each message's processing at each end (serialization, TLS, the RPC stack), in ms; 0 (default):
            the links alone. It decides a LAN's step, where a message's half millisecond on the wire is no more than
            its processing; `benchmarks/perf/transport_latency.py` measures lvfl's on a machine (a quarter of the
            round trip it prints).
        compute_scale: a factor on every party's measured compute (times its device class's), for compute that runs
            slower where the parties are than in this fit: a launched party process also runs the other parties'
            parts as shadows and its own training loop, on cores it may share. `benchmarks/perf/network_check.py`
            measures a launch's factor on a machine (docs/results.md). Default 1.
    """

    def __init__(
        self,
        links: str | dict[str, Any] = "lan",
        devices: dict[str, str] | None = None,
        seed: int = 0,
        keep_trace: bool = False,
        print_summary: bool = True,
        message_ms: float = 0.0,
        compute_scale: float = 1.0,
    ) -> None:
        if not (isinstance(message_ms, int | float) and math.isfinite(message_ms) and message_ms >= 0):
            raise ValueError(f"NetworkSimulator message_ms must be a finite time >= 0 (ms), got {message_ms!r}")
        if not (isinstance(compute_scale, int | float) and math.isfinite(compute_scale) and compute_scale > 0):
            raise ValueError(f"NetworkSimulator compute_scale must be a finite factor > 0, got {compute_scale!r}")
        self.compute_scale = float(compute_scale)
        self.message_s = float(message_ms) / 1e3
        self.links_spec = links
        self.devices = dict(devices or {})
        for party, name in self.devices.items():
            if name not in DEVICE_CLASSES:
                raise ValueError(
                    f"NetworkSimulator devices: party {party!r}: unknown device class {name!r}; "
                    f"classes: {sorted(DEVICE_CLASSES)}"
                )
        if isinstance(links, Mapping) and not {"up_mbps", "down_mbps", "latency_ms"} & set(links):
            clash = sorted(set(links) & set(self.devices) - {"default"})
            if clash:
                raise ValueError(f"NetworkSimulator: parties {clash} have both a link and a device class; give one")
            for party, spec in links.items():
                link_profile(spec, f"NetworkSimulator links[{party!r}]")  # refused now, not at the first message
        else:
            link_profile(links, "NetworkSimulator links")
        self.seed = int(seed)
        self.keep_trace = bool(keep_trace)
        self.print_summary = bool(print_summary)
        self.trace: list[Phase] = []
        self.wall_s = 0.0
        self.setup_s = 0.0
        self.steps = 0
        self.train_comm_s = 0.0
        self._epoch_s = 0.0
        self._epoch_comm_s = 0.0
        self._schedule: list[Message] = []
        self._last = 0.0
        self._phase = "setup"
        self._handle: int | None = None
        self._wire: Wire | None = None
        self._setup_logged = False
        self._links: dict[str, LinkProfile] = {}
        self._scale: dict[str, float] = {}
        self._step_comm = 0.0
        self._resume = "between"

    # ------------------------------------------------------------------------------------------------ the parties
    def _per_party(self) -> bool:
        spec = self.links_spec
        return isinstance(spec, Mapping) and not {"up_mbps", "down_mbps", "latency_ms"} & set(spec)

    def party_profile(self, party: str) -> tuple[LinkProfile, float]:
        """`party`'s link and compute scale under this configuration (a party nobody named: the default link)."""
        if party in self.devices:
            device: DeviceClass = DEVICE_CLASSES[self.devices[party]]
            return device.link, device.compute_scale * self.compute_scale
        spec = self.links_spec
        own = spec.get(party, spec.get("default", "lan")) if self._per_party() else spec
        return link_profile(own, f"NetworkSimulator links for {party!r}"), self.compute_scale

    def profiles(self, parties: list[str]) -> tuple[dict[str, LinkProfile], dict[str, float]]:
        """Each party's link and compute scale; a party named in the configuration but not in `parties` is refused."""
        named = set(self.devices) | (set(self.links_spec) - {"default"} if self._per_party() else set())
        missing = sorted(p for p in named if p not in parties)
        if missing:
            raise ValueError(f"NetworkSimulator: parties {missing} are not in this run (its parties: {parties})")
        pairs = {party: self.party_profile(party) for party in parties}
        return {k: v[0] for k, v in pairs.items()}, {k: v[1] for k, v in pairs.items()}

    # ------------------------------------------------------------------------------------------------ watching
    def _on_message(self, src: str, dst: str, tag: str, payload: Any) -> None:
        if self._phase == "validation":
            return
        now = time.perf_counter()
        self._schedule.append(Message(src, dst, payload_nbytes(payload), now - self._last))
        self._last = now
        for party in (src, dst):  # a party the datamodule does not describe (an HE backend's coordinator)
            if party not in self._links:
                self._links[party], self._scale[party] = self.party_profile(party)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Watch the protocol's wire from before the key exchange (the module's `setup` runs after this)."""
        if stage != "fit" or self._handle is not None:
            return
        wire = getattr(pl_module, "wire", None)
        if not isinstance(wire, Wire):
            raise TypeError(f"NetworkSimulator needs an lvfl protocol with a `wire`; got {type(pl_module).__name__}")
        names = [s.name for s in getattr(trainer.datamodule, "party_specs", [])] if trainer.datamodule else []
        self._links, self._scale = self.profiles(names)
        self._wire, self._phase, self._schedule = wire, "setup", []
        self._last = time.perf_counter()
        self._handle = wire.subscribe(self._on_message)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Stop watching."""
        if self._wire is not None and self._handle is not None:
            self._wire.unsubscribe(self._handle)
        self._handle = None

    def _close(self, kind: str, epoch: int, tail_s: float = 0.0) -> float:
        """Replay the pending schedule as one phase; returns its simulated time and adds it to the wall time."""
        schedule, self._schedule = tuple(self._schedule), []
        if not schedule and kind != "step":
            return 0.0
        timed = simulate(
            schedule, self._links, self._scale, tail_s, seed=self.seed + len(self.trace), message_s=self.message_s
        )
        if self.keep_trace:
            self.trace.append(Phase(kind, schedule, tail_s, epoch))
        self.wall_s += timed.step_s
        if kind == "step":
            self._epoch_s += timed.step_s
            self._epoch_comm_s += timed.comm_s
            self.train_comm_s += timed.comm_s
            self.steps += 1
            self._step_comm = timed.comm_s
        elif kind == "setup":
            self.setup_s += timed.step_s
        else:
            self._epoch_s += timed.step_s
        return timed.step_s

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Close the set-up phase (logged once) and start the epoch's totals."""
        self._close("setup" if self._phase == "setup" else "between", trainer.current_epoch)
        if not self._setup_logged:
            log_to_loggers(trainer, {"sim/setup_time": self.setup_s}, epoch=True)
            self._setup_logged = True
        self._phase, self._epoch_s, self._epoch_comm_s = "between", 0.0, 0.0
        self._last = time.perf_counter()

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Close what was sent between steps, then start the step's clock."""
        self._close("between", trainer.current_epoch)
        self._phase = "step"
        self._last = time.perf_counter()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Replay the step; log its times on the logging cadence."""
        tail = time.perf_counter() - self._last
        step_s = self._close("step", trainer.current_epoch, tail)
        self._phase = "between"
        self._last = time.perf_counter()
        if is_logging_step(trainer):
            figures = {"sim/comm_time": self._step_comm, "sim/step_time": step_s, "sim/wall_time": self.wall_s}
            log_to_loggers(trainer, figures)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Validation traffic is not simulated (close what came before it)."""
        if self._phase != "setup":
            self._close("between", trainer.current_epoch)
        self._resume = self._phase
        self._phase = "validation"

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Back to the phase validation interrupted."""
        self._phase = self._resume
        self._last = time.perf_counter()

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The epoch's simulated time and communication time, and the cumulative wall time."""
        self._close("between", trainer.current_epoch)
        figures = {"sim/epoch_time": self._epoch_s, "sim/epoch_comm_time": self._epoch_comm_s}
        log_to_loggers(trainer, {**figures, "sim/wall_time": self.wall_s}, epoch=True)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Print the simulated times."""
        if self.print_summary:
            rank_zero_info(self.summary())

    def summary(self) -> str:
        """One line: the profile, set-up, training and communication times, and the simulated wall time."""
        devices = f", devices {self.devices}" if self.devices else ""
        return (
            f"== simulated network time (links {self.links_spec}{devices}): set-up {self.setup_s:.3f} s, "
            f"{self.steps} training steps with {self.train_comm_s:.3f} s of communication on their critical paths, "
            f"wall time {self.wall_s:.3f} s =="
        )

    # ------------------------------------------------------------------------------------------------ replaying
    def replay(
        self, links: Mapping[str, LinkProfile], compute_scale: Mapping[str, float] | None = None
    ) -> dict[str, float]:
        """The kept trace (`keep_trace`) timed under other links: {"wall", "comm", "setup"} seconds."""
        if not self.keep_trace:
            raise RuntimeError("NetworkSimulator.replay needs keep_trace=True (the run's schedules)")
        out = {"wall": 0.0, "comm": 0.0, "setup": 0.0}
        for i, phase in enumerate(self.trace):
            timed = simulate(
                phase.schedule, links, compute_scale, phase.tail_s, seed=self.seed + i, message_s=self.message_s
            )
            out["wall"] += timed.step_s
            out["comm"] += timed.comm_s if phase.kind == "step" else 0.0
            out["setup"] += timed.step_s if phase.kind == "setup" else 0.0
        return out

    # ------------------------------------------------------------------------------------------------ resuming
    def state_dict(self) -> dict[str, Any]:
        """The cumulative figures, so a resumed fit continues its simulated clock."""
        return {"wall_s": self.wall_s, "setup_s": self.setup_s, "steps": self.steps, "comm_s": self.train_comm_s}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore `state_dict`."""
        self.wall_s = float(state_dict.get("wall_s", 0.0))
        self.setup_s = float(state_dict.get("setup_s", 0.0))
        self.steps = int(state_dict.get("steps", 0))
        self.train_comm_s = float(state_dict.get("comm_s", 0.0))
        self._setup_logged = True
