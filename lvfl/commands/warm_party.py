"""A party process started warm by `lvfl launch` (`lvfl.commands.warm_start`): `python -m lvfl.commands.warm_party`.

It imports what a party needs, answers the launcher's questions on the way (the config's party names, read with
LightningCLI as `lvfl launch` reads them), then runs its part exactly as `python -m lvfl party ...` would: the same
command line through the same front door (`lvfl.commands.entry.main`), the same environment, its output on the
console or appended to its log. A part that needs another thread count or GPU than this process imported with
replaces the process with a fresh one (`os.execve`): such settings hold from the import on.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from typing import Any

from lvfl.commands.warm_start import PARTY_IMPORTED, REPLY_FD, needs_fresh_process


def answer(question: dict[str, Any]) -> dict[str, Any]:
    """The answer to one question of the launcher: the config's parties (`launch.config_parties`).

    On a refusal, only the error's name: the launcher then reads the config itself, to refuse it with the error the
    command has always given.
    """
    if question.get("do") != "parties":
        return {"error": f"no question {question.get('do')!r}"}
    from lvfl.commands import launch

    try:
        found = launch.config_parties(question["args"], question["allow_public_seeds"], question["fits"])
    except Exception as error:  # noqa: BLE001 - any refusal: the launcher repeats it in its own process
        return {"error": type(error).__name__}
    return dict(zip(("names", "active", "save_dir"), found, strict=True))


def become(part: dict[str, Any], imported: float) -> None:
    """Run the part: `python -m lvfl ARGV` in this process (or in a fresh one, where the imports depended on it)."""
    env = dict(part["env"])
    if part["log"] is not None:  # appended, as the launcher opens a cold party's log
        sys.stdout.flush()
        sys.stderr.flush()
        log = os.open(part["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
    front_door = importlib.util.find_spec("lvfl.__main__").origin  # sys.argv[0] of `python -m lvfl`
    argv = [front_door, *part["argv"]]
    if needs_fresh_process(os.environ, env):
        os.execve(sys.executable, [sys.executable, "-m", "lvfl", *part["argv"]], env)  # noqa: S606 - lvfl's own
    os.environ.clear()
    os.environ.update({**env, PARTY_IMPORTED: f"{imported:.6f}"})
    sys.argv = argv
    from lvfl.commands import entry

    entry.main()


def main() -> None:
    """Import, then answer the launcher until it gives this process a part (run it) or hangs up (end).

    Interrupted before its part (Ctrl-C reaches the launcher's whole process group), it ends quietly with status
    130: the launcher reports the interruption, as it did before any party had started.
    """
    try:
        from lvfl.commands import entry, launch, party  # noqa: F401 - the imports this process is started early for

        imported = time.time()
        replies = os.fdopen(int(os.environ.pop(REPLY_FD)), "w")
        for line in sys.stdin:
            message = json.loads(line)
            if message.get("do") == "run":
                replies.close()
                break
            replies.write(json.dumps(answer(message)) + "\n")
            replies.flush()
        else:  # the launcher hung up: no part for this process
            return
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    become(message, imported)


if __name__ == "__main__":
    main()
