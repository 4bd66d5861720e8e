"""`lvfl launch`: every party of a config as its own local process, over a throw-away certificate authority.

`lvfl launch --config C.yaml [lvfl fit options]` is the one-machine rehearsal of a federation: it writes a throw-away
certificate authority, a certificate per party and a federation file on free localhost ports (into `--pki`, or a fresh
temporary folder that is deleted, keys and all, when the launch ends; the CA's key is never written, so no certificate
can be minted with it afterwards), then starts `lvfl party` once per party of the config, each with its own log folder
``<save_dir>/<party>`` (and on a host with several GPUs, its own GPU). Each party keeps torch's thread count (as
`lvfl fit` does: floating-point sums depend on how many threads split them, so the same count is what makes the two runs
bit-identical); `--threads N` gives every party N threads instead, which is faster when the parties share few cores
(compare with `OMP_NUM_THREADS=N lvfl fit`). The active party's output is the console's; every other party's is appended
to ``<save_dir>/<party>.log`` under a header naming the launch, so an earlier launch's log stays. When the parties end
it prints each one's run folder and log, and exits 0 when every party did, else with the first failing party's status
and one line per failed party.

The launcher itself loads neither PyTorch nor Lightning: it starts two party processes first, which import them while
the first reads the config for it (the party names), and gives each a party's part once the names are known; any
further party starts then (`lvfl.commands.warm_start`). On a host with several GPUs, where each party gets its own,
every party starts once the config is read.

`--network wan` (any `lvfl.network.LINK_PRESETS` name) puts a `lvfl.federation.link_proxy.LinkProxy` between the
parties: each party's federation file names each peer at the proxy's port for that pair, and the proxy delays and
paces the bytes as that access link would; the launch ends with the bytes it carried per link.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from lvfl.commands.config_files import ALLOW_PUBLIC_SEEDS_HELP, SETUP_TIMEOUT
from lvfl.commands.errors import OneLineParser, debug_requested, reported_errors
from lvfl.commands.warm_start import (
    LAUNCH_STARTED,
    PARTY_IMPORTED,
    PARTY_STARTED,
    SUBCOMMANDS,
    WarmParty,
    warm_start_possible,
)
from lvfl.federation.federation_file import write_federation
from lvfl.federation.link_proxy import LinkProxy
from lvfl.federation.pki import write_test_pki
from lvfl.network import LINK_PRESETS

__all__ = ["launch", "main"]

LAUNCH_HELP = (
    "usage: lvfl launch [fit|validate|test|predict] [--pki DIR] [--timeout S] [--setup_timeout S] [--run_id ID] "
    "--config C.yaml "
    "[options]\n\n"
    "Run every party of the config as its own local process (lvfl party), over mutual-TLS gRPC on localhost with a "
    "throw-away certificate authority: the federation rehearsed on one machine."
)


#: the environment variable that gives `--jitter_ms` its default (the test suite's stress mode sets it)
JITTER_VARIABLE = "LVFL_LAUNCH_JITTER_MS"


def launch_parser() -> argparse.ArgumentParser:
    """The options of `lvfl launch` itself; every other argument is `lvfl fit`'s, passed to every party."""
    parser = OneLineParser(prog="lvfl launch", add_help=False)
    parser.add_argument("--pki", type=Path, default=None, help="where to write the test PKI (default: a temp folder)")
    parser.add_argument("--timeout", type=float, default=60.0, help="each party's --timeout (default 60 s)")
    parser.add_argument(
        "--setup_timeout",
        type=float,
        default=SETUP_TIMEOUT,
        help=f"each party's --setup_timeout (default {SETUP_TIMEOUT:g} s)",
    )
    parser.add_argument("--run_id", default=None, help="the run ID (default: a fresh random one)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per party (OMP_NUM_THREADS; default: torch's, as lvfl fit has). Parties sharing few "
        "cores run faster with fewer; results are bit-identical to a fit with the same count",
    )
    parser.add_argument(
        "--network",
        default=None,
        choices=sorted(LINK_PRESETS),
        help="route every party's connections through a proxy that gives each party this access link (delay and "
        "rate, as NetworkSimulator's preset of the name: wan = 100 Mbps and 50 ms one way between two parties); "
        "default: localhost as it is",
    )
    parser.add_argument(
        "--jitter_ms",
        type=float,
        default=float(os.environ.get(JITTER_VARIABLE) or 0.0),
        help="hold every chunk between two parties a further random 0 to this many ms (through the proxy, on the "
        f"--network's links or on localhost's), as a busy network would; default ${JITTER_VARIABLE} or 0",
    )
    parser.add_argument(
        "--rehearse",
        action="store_true",
        help="run every party's process in this one instead, in turns, messages in memory (lvfl.commands.rehearse): "
        "the same run folders, no sockets and no timing; a message one party sends and another never takes fails "
        "in one line",
    )
    parser.add_argument("--allow_public_seeds", action="store_true", help=ALLOW_PUBLIC_SEEDS_HELP)
    return parser


def launch(
    fit_args: list[str],
    pki: Path | None = None,
    timeout: float = 60.0,
    run_id: str | None = None,
    threads: int | None = None,
    allow_public_seeds: bool = False,
    network: str | None = None,
    warm: bool | None = None,
    setup_timeout: float = SETUP_TIMEOUT,
    jitter_ms: float = 0.0,
) -> int:
    """Start one `lvfl party` process per party of the config in `fit_args`; their exit status (0: all succeeded).

    With `network` (a `lvfl.network.LINK_PRESETS` name) the parties talk through a `LinkProxy` giving each that link;
    with `jitter_ms` through one that also holds each chunk a random 0 to `jitter_ms` ms (localhost's links where
    no `network` is given). `warm` (default: where `warm_start_possible`) starts two party processes before the
    config is read, one of which reads it (`lvfl.commands.warm_start`); the others start once their names are known.
    """
    marks = {LAUNCH_STARTED: f"{time.time():.6f}"}  # the set-up report's first mark (`lvfl.commands.party.SetupReport`)
    subcommand = fit_args[0] if fit_args and fit_args[0] in SUBCOMMANDS else None
    if subcommand is not None:
        fit_args = fit_args[1:]
    fits = subcommand in (None, "fit")
    base_env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads is not None else {})}
    pool = [WarmParty(base_env) for _ in range(2)] if (warm_start_possible() if warm is None else warm) else []
    try:
        question = {"do": "parties", "args": fit_args, "allow_public_seeds": allow_public_seeds, "fits": fits}
        found = pool[0].ask(question) if pool else None
        if found is None or "error" in found:  # read here: a refusal is the one this command has always given
            # loaded only here, on a cold start or a refusal: the launcher's own imports stay free of PyTorch
            from lvfl.commands.launch_parties import config_parties

            names, active, save_dir, ranks = config_parties(fit_args, allow_public_seeds, fits)
        else:
            names, active, save_dir, ranks = found["names"], found["active"], found["save_dir"], found["ranks"]
        if ranks > 1:  # Lightning starts each party's other ranks by running its command again: `python -m lvfl`
            for process in pool:
                process.close()
            pool = []
        if allow_public_seeds:
            fit_args = ["--allow_public_seeds", *fit_args]
        fit_args = ["--setup_timeout", f"{setup_timeout:g}", *fit_args]  # an option of each party's own
        save_dir = save_dir or "runs"
        pki_dir = Path(tempfile.mkdtemp(prefix="lvfl-pki-")) if pki is None else pki
        try:
            return _launch_parties(
                names, active, save_dir, pki_dir, subcommand, fit_args, timeout, run_id, threads, network, marks, pool,
                ranks, jitter_ms,
            )  # fmt: skip
        finally:
            if pki is None:  # throw-away keys: nothing of them stays on the disk
                shutil.rmtree(pki_dir, ignore_errors=True)
    finally:
        for process in pool:  # those given no part end
            process.close()


def _launch_parties(
    names: list[str],
    active: str,
    save_dir: str,
    pki_dir: Path,
    subcommand: str | None,
    fit_args: list[str],
    timeout: float,
    run_id: str | None,
    threads: int | None,
    network: str | None,
    marks: dict[str, str],
    pool: list[WarmParty],
    ranks: int = 1,
    jitter_ms: float = 0.0,
) -> int:
    """Write the PKI and the federation file into `pki_dir`, start a process per party, wait for them all.

    With `ranks` > 1 each party is a process group of that many ranks (its process starts the others), and the
    federation file lists an address per rank.
    """
    write_test_pki(pki_dir, names, ca_key=None)
    federation = pki_dir / "federation.yaml"
    written = write_federation(federation, names, ranks=ranks).parties
    addresses = {name: list(party.addresses) if ranks > 1 else party.address for name, party in written.items()}
    files = dict.fromkeys(names, federation)
    proxy = None
    if network is not None or jitter_ms > 0:  # each party's own file: its own address, each peer's at the proxy's
        link = LINK_PRESETS[network or "unlimited"]
        # each end draws half: a chunk's extra delay is then uniform in [0, jitter_ms]
        proxy = LinkProxy(dict.fromkeys(names, dataclasses.replace(link, jitter_ms=jitter_ms / 2)))
        for name in names:  # a peer's ranks share its access link: one route per rank, paced as one link
            routed = {
                peer: proxy.route(name, peer, a) if isinstance(a, str) else [proxy.route(name, peer, r) for r in a]
                for peer, a in addresses.items()
                if peer != name
            }
            files[name] = pki_dir / f"federation.{name}.yaml"
            write_federation(files[name], names, addresses={**routed, name: addresses[name]})
        proxy.start()
    try:
        return _run_parties(
            names, active, save_dir, files, subcommand, fit_args, timeout, run_id, threads, network, marks, pool, ranks
        )
    finally:
        if proxy is not None:
            proxy.close()
            total = sum(proxy.socket_bytes.values())
            each = ", ".join(f"{src}->{dst} {n:,}" for (src, dst), n in sorted(proxy.socket_bytes.items()))
            what = f"the {network or 'localhost'} network" + (f" with {jitter_ms:g} ms of jitter" if jitter_ms else "")
            print(f"lvfl launch: {what} carried {total:,} bytes ({each})", flush=True)


def _run_parties(
    names: list[str],
    active: str,
    save_dir: str,
    files: dict[str, Path],
    subcommand: str | None,
    fit_args: list[str],
    timeout: float,
    run_id: str | None,
    threads: int | None,
    network: str | None,
    marks: dict[str, str],
    pool: list[WarmParty],
    ranks: int = 1,
) -> int:
    """Start a process per party, each with its federation file, and wait for them all.

    The warm processes of `pool` take the first parts (the active party's first); the rest start now. `marks` go
    into each party's environment, with when its process was started: its set-up report's (`SetupReport`).
    """
    run_id = run_id or f"launch-{uuid.uuid4().hex[:12]}"
    gpus = 0 if pool else _gpu_count()  # a warm launch sees at most one GPU (`warm_start_possible`)
    processes: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    over = f", over a {network} network (lvfl.network.LINK_PRESETS)" if network else ""
    federation = files[active].parent / "federation.yaml"
    listed = f"{len(names)} parties ({', '.join(names)})"
    print(f"lvfl launch: {listed}, run {run_id}, federation {federation}{over}", flush=True)
    warm = list(pool)
    for i, name in sorted(enumerate(names), key=lambda item: item[1] != active):
        argv = [
            "party",
            *([subcommand] if subcommand else []),
            "--party",
            name,
            "--federation",
            str(files[name]),
            "--run_id",
            run_id,
            "--timeout",
            f"{timeout:g}",
            *fit_args,
            f"--trainer.logger.init_args.save_dir={Path(save_dir) / name}",
        ]
        process = warm.pop(0) if warm else None
        env = {**os.environ, **marks, PARTY_STARTED: f"{process.started if process else time.time():.6f}"}
        env.pop(PARTY_IMPORTED, None)  # a warm process sets its own; no other has one
        if threads is not None:
            env["OMP_NUM_THREADS"] = str(threads)
        if gpus > 1:  # each party its own GPUs, one per rank (shared round the parties where there are fewer)
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str((i * ranks + r) % gpus) for r in range(ranks))
        log = None
        if name != active:
            argv.append("--trainer.enable_progress_bar=false")
            log = logs[name] = Path(save_dir) / f"{name}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("a") as out:  # appended: an earlier launch's log stays, under its own header
                out.write(
                    f"== lvfl launch {subcommand or 'fit'}, run {run_id}, {time.strftime('%Y-%m-%d %H:%M:%S')} ==\n"
                )
        given = process.run(argv, env, log) if process is not None else None  # None: it ended before its part
        processes[name] = given if given is not None else _start(argv, env, log)
    processes = {name: processes[name] for name in names}  # the config's order, for the reports below
    if logs:
        shown = ", ".join(f"{name} -> {log}" for name, log in logs.items())
        print(f"lvfl launch: the other parties' output is appended to their logs ({shown})", flush=True)
    started = time.time()
    status = _wait(processes, logs, grace=timeout + 30)
    for name in names:  # where each party wrote: its run folder (predict and test write none) and its log
        folder = _newest_run(Path(save_dir) / name, since=started)
        where = [str(folder)] if folder is not None else []
        where += [f"log {logs[name]}"] if name in logs else []
        if where:
            print(f"lvfl launch: {name}: {', '.join(where)}", flush=True)
    return status


def _start(argv: list[str], env: dict[str, str], log: Path | None) -> subprocess.Popen:
    """`python -m lvfl ARGV` as a fresh process, its output appended to `log` (None: this console)."""
    command = [sys.executable, "-m", "lvfl", *argv]
    if log is None:
        return subprocess.Popen(command, env=env)  # noqa: S603 - lvfl's own command
    with log.open("a") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)  # noqa: S603 - lvfl's own


def _newest_run(root: Path, since: float) -> Path | None:
    """The newest `<root>/<name>/version_N` folder written since `since` (a party's run of this launch), or None."""
    folders = [p for p in root.glob("*/version_*") if p.is_dir() and p.stat().st_mtime >= since - 1]
    return max(folders, key=lambda p: p.stat().st_mtime, default=None)


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 (no GPU runtime: no GPU)
        return 0


def _wait(processes: dict[str, subprocess.Popen], logs: dict[str, Path], grace: float) -> int:
    """Wait for every party; once one fails, give the others `grace` seconds to stop by themselves, then kill them."""
    failed_at: float | None = None
    try:
        while any(p.poll() is None for p in processes.values()):
            if failed_at is None and any(p.returncode not in (None, 0) for p in processes.values()):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > grace:
                for p in processes.values():
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.2)
    except KeyboardInterrupt:
        for p in processes.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in processes.values():
            p.wait()
    status = 0
    for name, p in processes.items():
        if p.returncode != 0:
            status = status or p.returncode or 1
            print(f"lvfl launch: {name} exited with status {p.returncode}{_last_line(logs.get(name))}", file=sys.stderr)
    return status


def _last_line(log: Path | None) -> str:
    if log is None or not log.is_file():
        return ""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return f": {lines[-1]} (log: {log})" if lines else f" (log: {log})"


def main(argv: list[str]) -> None:
    """`lvfl launch`."""
    if not argv or argv[0] in ("-h", "--help"):
        print(LAUNCH_HELP, end="\n\n")
        print(launch_parser().format_help().split("\n\n", 1)[1])  # argparse's own usage block, whole lines
        return
    debug, argv = debug_requested(argv)
    with reported_errors(debug):
        own, rest = launch_parser().parse_known_args(argv)
        if not own.timeout > 0:
            raise ValueError(f"--timeout must be a positive number of seconds, got {own.timeout}")
        if not own.setup_timeout >= own.timeout:
            raise ValueError(f"--setup_timeout must be at least --timeout ({own.timeout:g} s), got {own.setup_timeout}")
        if not 0 <= own.jitter_ms <= 10_000:
            raise ValueError(f"--jitter_ms must be between 0 and 10000 ms, got {own.jitter_ms}")
        if own.threads is not None and own.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {own.threads}")
        if own.rehearse:
            from lvfl.commands.rehearse import rehearse  # PyTorch and Lightning: this process runs every party

            subcommand = rest[0] if rest and rest[0] in SUBCOMMANDS else "fit"
            views = rehearse(rest[1:] if rest and rest[0] in SUBCOMMANDS else rest, subcommand=subcommand,
                             allow_public_seeds=own.allow_public_seeds)  # fmt: skip
            print(f"lvfl launch --rehearse: {len(views)} parties ran {subcommand} in this process, in turns; every "
                  "message one sent, another took")  # fmt: skip
            raise SystemExit(0)
        status = launch(
            [*rest, *(["--debug"] if debug else [])],
            own.pki,
            own.timeout,
            own.run_id,
            own.threads,
            own.allow_public_seeds,
            own.network,
            setup_timeout=own.setup_timeout,
            jitter_ms=own.jitter_ms,
        )
    raise SystemExit(status)
