"""A party's transport in a process of its own, for tests that attack it: `python tests/federation_victim.py ...`.

It starts `lvfl.federation.transport.Transport` for `--party` (the project's own server, certificates and checks),
prints ``listening`` once its server is up, greets `--greet` peers (as `lvfl party` does before set-up), then takes
`--receive` messages (``PEER:TAG`` each, in order, each for step 0), and ends with one JSON line on standard output:
``{"ok": ..., "error": the one-line refusal or null, "start_mb": ..., "rss_mb": ..., "peak_mb": ...}`` (resident memory
once listening, and resident and peak resident memory at the end, from /proc). `--linger S` keeps the server up S
seconds more before it closes, so that an attacker can still reach it after the last receive.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from lvfl.federation import FederationError
from lvfl.federation.transport import Transport


def memory_mb() -> dict[str, float]:
    """This process's resident and peak resident memory (VmRSS, VmHWM), in MiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {"rss_mb": int(fields["VmRSS"].split()[0]) / 1024, "peak_mb": int(fields["VmHWM"].split()[0]) / 1024}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--federation", type=Path, required=True)
    parser.add_argument("--party", required=True)
    parser.add_argument("--run_id", default="run-1")
    parser.add_argument("--fingerprint", default="model=1,data=2,seed=3,trainer=4")
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--greet", nargs="*", default=[])
    parser.add_argument("--receive", nargs="*", default=[], metavar="PEER:TAG")
    parser.add_argument("--linger", type=float, default=0.0)
    args = parser.parse_args()
    transport = Transport(
        args.party, args.federation, args.run_id, timeout=args.timeout, fingerprint=args.fingerprint
    ).start()
    start = memory_mb()["rss_mb"]
    print("listening", flush=True)
    result: dict = {"ok": True, "error": None, "start_mb": start}
    try:
        if args.greet:
            transport.hello(args.greet)
        for item in args.receive:
            peer, _, tag = item.partition(":")
            transport.receive(peer, tag, 0)
    except FederationError as err:
        result.update(ok=False, error=str(err))
    time.sleep(args.linger)
    result.update(memory_mb())
    transport.close()
    print(json.dumps(result), flush=True)
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
