"""The network model against hand-computed schedules, and `NetworkSimulator` on real runs."""

from __future__ import annotations

import csv

import pytest
import torch
from helpers import easter, make_trainer

from lvfl.callbacks import CommunicationMeter, NetworkSimulator
from lvfl.datamodules import Wine
from lvfl.network import DEVICE_CLASSES, LINK_PRESETS, LinkProfile, Message, simulate
from lvfl.privacy import DHMasking

LINKS = {
    "a": LinkProfile(100.0, 100.0, 10.0),
    "p1": LinkProfile(50.0, 100.0, 5.0),
    "p2": LinkProfile(50.0, 100.0, 20.0),
}
# two uploads to the active party, then one download to each passive party (EASTER's shape, 1 MB-sized messages)
SCHEDULE = [
    Message("p1", "a", 1_000_000, compute_s=0.1),
    Message("p2", "a", 500_000, compute_s=0.05),
    Message("a", "p1", 250_000, compute_s=0.02),
    Message("a", "p2", 250_000, compute_s=0.0),
]


def test_a_schedule_takes_exactly_the_hand_computed_time():
    """Worked by hand from the model in lvfl.network (times in seconds; p2 computes twice as slowly).

    With compute: p1's upload starts at 0.1, takes 8e6 / 50e6 = 0.16 s, arrives 0.26 + 0.015 = 0.275; p2 is ready at
    0.1 but the active downlink is busy until 0.26: 0.26 + 0.08 = 0.34, arrives 0.37. The active party waits for both
    (0.37), computes 0.02: its download to p1 runs 0.39-0.41, arrives 0.425; to p2 0.41-0.43 (its uplink was busy),
    arrives 0.46. Tails: p1 0.425 + 0.01, p2 0.46 + 0.02 = 0.48, the step. Without compute: 0-0.16 (arrives 0.175),
    0.16-0.24 (0.27), 0.27-0.29 (0.305), 0.29-0.31 (0.34): 0.34.
    """
    timed = simulate(SCHEDULE, LINKS, {"p2": 2.0}, tail_s=0.01)
    assert timed.arrivals == pytest.approx((0.275, 0.37, 0.425, 0.46), abs=1e-12)
    assert timed.step_s == pytest.approx(0.48, abs=1e-12)
    assert timed.comm_s == pytest.approx(0.34, abs=1e-12)


def test_each_message_costs_both_ends_its_processing_time():
    """The schedule above with 0.01 s of processing per message at each end, worked by hand.

    With compute: p1 computes 0.1 and processes 0.01, sends 0.11-0.27, arrives 0.285, handled 0.295. p2 is ready at
    0.11, waits for the active downlink: 0.27-0.35, arrives 0.38, handled 0.39. The active party (0.39) computes 0.02
    and processes 0.01: 0.42-0.44, arrives 0.455 at p1, handled 0.465; then processes 0.01 (0.43), waits for its
    uplink: 0.44-0.46, arrives 0.49 at p2, handled 0.50. Tails: p1 0.475, p2 0.50 + 0.02 = 0.52, the step. Without
    compute: 0.01-0.17 (handled 0.195), 0.17-0.25 (0.29), 0.30-0.32 (0.345), 0.32-0.34 (0.38): 0.38.
    """
    timed = simulate(SCHEDULE, LINKS, {"p2": 2.0}, tail_s=0.01, message_s=0.01)
    assert timed.arrivals == pytest.approx((0.295, 0.39, 0.465, 0.50), abs=1e-12)
    assert timed.step_s == pytest.approx(0.52, abs=1e-12)
    assert timed.comm_s == pytest.approx(0.38, abs=1e-12)
    # a receiving end takes one message at a time: two that arrive together are handled one after the other
    links = {p: LinkProfile(1000.0, 1000.0, 0.0) for p in ("a", "b", "c")}
    together = simulate([Message("a", "c", 0), Message("b", "c", 0)], links, message_s=0.01)
    assert together.arrivals == pytest.approx((0.02, 0.03), abs=1e-12)
    assert simulate(SCHEDULE, LINKS, {"p2": 2.0}, tail_s=0.01, message_s=0.0) == simulate(
        SCHEDULE, LINKS, {"p2": 2.0}, tail_s=0.01
    )
    for bad in (-0.001, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="message_s"):
            simulate(SCHEDULE, LINKS, message_s=bad)


def test_messages_on_disjoint_links_travel_in_parallel_and_shared_ones_queue():
    links = {p: LinkProfile(10.0, 10.0, 0.0) for p in ("a", "b", "c", "d")}
    one = 1_250_000  # 1 s at 10 Mbps
    parallel = simulate([Message("a", "b", one), Message("c", "d", one)], links)
    assert parallel.comm_s == pytest.approx(1.0)
    queued = simulate([Message("a", "b", one), Message("c", "b", one)], links)  # b's downlink, twice
    assert queued.comm_s == pytest.approx(2.0)
    relayed = simulate([Message("a", "b", one), Message("b", "c", one)], links)  # b waits for what it forwards
    assert relayed.arrivals == pytest.approx((1.0, 2.0))


def test_latency_is_both_ends_one_way_and_jitter_is_seeded_and_bounded():
    links = {"a": LinkProfile(1000.0, 1000.0, 30.0, jitter_ms=10.0), "b": LinkProfile(1000.0, 1000.0, 20.0)}
    plain = simulate([Message("a", "b", 0)], {k: LinkProfile(1000.0, 1000.0, v.latency_ms) for k, v in links.items()})
    assert plain.comm_s == pytest.approx(0.050)
    draws = [simulate([Message("a", "b", 0)], links, seed=s).comm_s for s in range(20)]
    assert all(0.050 <= d <= 0.060 for d in draws)
    assert len(set(draws)) > 1
    assert simulate([Message("a", "b", 0)], links, seed=3) == simulate([Message("a", "b", 0)], links, seed=3)


def test_bad_profiles_and_configurations_are_refused_by_name():
    with pytest.raises(ValueError, match="up_mbps must be a finite rate > 0"):
        LinkProfile(0.0, 10.0, 1.0)
    with pytest.raises(ValueError, match="latency_ms must be a finite time >= 0"):
        LinkProfile(10.0, 10.0, -1.0)
    with pytest.raises(ValueError, match="unknown link preset 'wifi'"):
        NetworkSimulator(links="wifi")
    with pytest.raises(ValueError, match=r"links\['party1'\]: unknown link preset"):
        NetworkSimulator(links={"party1": "dsl"})
    with pytest.raises(ValueError, match="party 'party2': unknown device class 'medium'"):
        NetworkSimulator(devices={"party2": "medium"})
    with pytest.raises(ValueError, match=r"parties \['party1'\] have both a link and a device class"):
        NetworkSimulator(links={"party1": "lan"}, devices={"party1": "low"})
    with pytest.raises(ValueError, match=r"parties \['party9'\] are not in this run"):
        NetworkSimulator(devices={"party9": "low"}).profiles(["party0", "party1"])
    with pytest.raises(ValueError, match="NetworkSimulator message_ms must be a finite time >= 0"):
        NetworkSimulator(message_ms=-0.5)
    for bad in (0, -1.0, float("inf"), "2"):
        with pytest.raises(ValueError, match="NetworkSimulator compute_scale must be a finite factor > 0"):
            NetworkSimulator(compute_scale=bad)
    with pytest.raises(KeyError, match="party 'x' has no link profile"):
        simulate([Message("x", "a", 1)], {"a": LINK_PRESETS["lan"]})


def fit(tmp_path, simulator: NetworkSimulator, epochs: int = 2):
    dm = Wine(num_parties=3, batch_size=32)
    model = easter(3, aggregation=DHMasking())
    trainer = make_trainer(tmp_path, max_epochs=epochs, callbacks=[CommunicationMeter(print_summary=False), simulator])
    trainer.fit(model, datamodule=dm)
    return model, trainer


def test_the_simulator_replays_every_training_message_and_logs_its_times(tmp_path):
    torch.manual_seed(0)
    sim = NetworkSimulator(links="100mbps_10ms", keep_trace=True, print_summary=False)
    model, trainer = fit(tmp_path, sim)
    steps = [p for p in sim.trace if p.kind == "step"]
    assert len(steps) == trainer.global_step // 3  # manual optimization: one optimizer step per party
    assert sim.steps == len(steps)
    setup = [p for p in sim.trace if p.kind == "setup"]
    tags = model.wire.bytes_by_tag()
    assert sum(m.nbytes for p in setup for m in p.schedule) == tags["keys"] + tags["split"]  # the set-up messages
    with (tmp_path / "t" / "version_0" / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    epoch_bytes = [float(r["train/comm/epoch_bytes"]) for r in rows if r.get("train/comm/epoch_bytes")]
    training = [p for p in sim.trace if p.kind != "setup"]
    traced = [sum(m.nbytes for p in training if p.epoch == e for m in p.schedule) for e in (0, 1)]
    assert traced == epoch_bytes  # every training message, validation's excluded
    walls = [float(r["sim/wall_time"]) for r in rows if r.get("sim/epoch_time")]
    assert walls[-1] == pytest.approx(sim.wall_s)
    assert [float(r["sim/setup_time"]) for r in rows if r.get("sim/setup_time")] == [pytest.approx(sim.setup_s)]
    # replaying the trace under the same links gives the same clock; slower links take longer, latency adds per step
    links = {p: LINK_PRESETS["100mbps_10ms"] for p in model.party_names}
    assert sim.replay(links)["wall"] == pytest.approx(sim.wall_s)
    slow = sim.replay({p: LinkProfile(10.0, 10.0, 10.0) for p in model.party_names})
    far = sim.replay({p: LinkProfile(100.0, 100.0, 50.0) for p in model.party_names})
    base = sim.replay(links)
    assert slow["comm"] > base["comm"]
    # each message on a step's critical path pays 2 x 40 ms more one-way latency: at least one message per step
    assert far["comm"] - base["comm"] >= 0.08 * len(steps) - 1e-9


def test_a_slow_device_makes_the_step_longer(tmp_path):
    links = {p: DEVICE_CLASSES["high"].link for p in ("party0", "party1", "party2")}
    sim = NetworkSimulator(links="lan", keep_trace=True, print_summary=False)
    fit(tmp_path, sim, epochs=1)
    fast = sim.replay(links, {p: 1.0 for p in links})
    one_slow = sim.replay({**links, "party2": DEVICE_CLASSES["low"].link}, {"party2": 4.0})
    assert one_slow["wall"] > fast["wall"]
    assert one_slow["comm"] > fast["comm"]


def test_a_compute_scale_stretches_every_partys_compute_on_the_run(tmp_path):
    """`compute_scale` multiplies each party's factor (its device class's too), and the run's clock is the trace
    replayed at those factors."""
    sim = NetworkSimulator(links="lan", devices={"party2": "low"}, compute_scale=2.5, keep_trace=True,
                           print_summary=False)  # fmt: skip
    assert sim.profiles(["party0", "party1", "party2"])[1] == {"party0": 2.5, "party1": 2.5, "party2": 10.0}
    model, _ = fit(tmp_path, sim, epochs=1)
    links = {**{p: LINK_PRESETS["lan"] for p in model.party_names}, "party2": DEVICE_CLASSES["low"].link}
    assert sim.replay(links, {"party0": 2.5, "party1": 2.5, "party2": 10.0})["wall"] == pytest.approx(sim.wall_s)
    assert sim.replay(links, {"party0": 1.0, "party1": 1.0, "party2": 4.0})["wall"] < sim.wall_s


def test_the_simulator_charges_each_message_its_processing_on_the_run(tmp_path):
    """`message_ms` times every phase of the run with that processing: the clock is the trace replayed with it, and
    each step's critical path, a chain of messages each handled at both ends, grows by at least 2 x message_ms."""
    torch.manual_seed(0)
    sim = NetworkSimulator(links="lan", keep_trace=True, print_summary=False, message_ms=2.0)
    fit(tmp_path, sim, epochs=1)
    links = {p: LINK_PRESETS["lan"] for p in ("party0", "party1", "party2")}
    wall = sum(simulate(p.schedule, links, None, p.tail_s, seed=sim.seed + i, message_s=0.002).step_s
               for i, p in enumerate(sim.trace))  # fmt: skip
    free = sum(simulate(p.schedule, links, None, p.tail_s, seed=sim.seed + i).step_s for i, p in enumerate(sim.trace))
    assert sim.wall_s == pytest.approx(wall)
    assert sim.replay(links)["wall"] == pytest.approx(wall)
    steps = [p for p in sim.trace if p.kind == "step"]
    assert wall - free >= 2 * 0.002 * len(steps) - 1e-9
