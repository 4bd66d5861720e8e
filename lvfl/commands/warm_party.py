"""A party process started warm by `lvfl launch` (`lvfl.commands.warm_start`): `python -m lvfl.commands.warm_party`.

It imports what a party needs, answers the launcher's questions on the way (the config's party names, read with
LightningCLI as `lvfl launch` reads them), then runs its part exactly as `python -m lvfl party ...` would: the same
command line through the same front door (`lvfl.commands.entry.main`), the same environment, its output on the
console or appended to its log. A part that needs another thread count or GPU than this process imported with
replaces the process with a fresh one (`os.execve`): such settings hold from the import on.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

# interrupted before its part (Ctrl-C reaches the launcher's whole process group), it ends quietly with status 130,
# its imports included: the launcher reports the interruption, as it did before any party had started
signal.signal(signal.SIGINT, lambda *_: os._exit(130))

from lvfl.commands import entry  # noqa: E402 - after the handler: the imports this process is started early for
from lvfl.commands.errors import quiet_third_party  # noqa: E402
from lvfl.commands.launch_parties import config_parties  # noqa: E402
from lvfl.commands.warm_start import (  # noqa: E402
    PARTY_IMPORTED,
    REPLY_FD,
    needs_fresh_process,
    take_front_door,
)

IMPORTED = time.time()


def answer(question: dict[str, Any]) -> dict[str, Any]:
    """The answer to one question of the launcher: the config's parties (`launch_parties.config_parties`).

    On a refusal, only the error's name: the launcher then reads the config itself, to refuse it with the error the
    command has always given.
    """
    if question.get("do") != "parties":
        return {"error": f"no question {question.get('do')!r}"}
    try:
        with quiet_third_party():  # Lightning's set-up lines and tips, silenced as every command silences them
            found = config_parties(question["args"], question["allow_public_seeds"], question["fits"])
    except Exception as error:  # noqa: BLE001 - any refusal: the launcher repeats it in its own process
        return {"error": type(error).__name__}
    return dict(zip(("names", "active", "save_dir", "ranks"), found, strict=True))


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
    if needs_fresh_process(os.environ, env):
        os.execve(sys.executable, [sys.executable, "-m", "lvfl", *part["argv"]], env)  # noqa: S606 - lvfl's own
    os.environ.clear()
    os.environ.update({**env, PARTY_IMPORTED: f"{imported:.6f}"})
    take_front_door(part["argv"])  # sys.argv and __main__ as `python -m lvfl` has them
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the party's own: as `python -m lvfl party` has it
    entry.main()


def main() -> None:
    """Answer the launcher until it gives this process a part (run it) or hangs up (end)."""
    replies = os.fdopen(int(os.environ.pop(REPLY_FD)), "w")
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("do") == "run":
            replies.close()
            become(message, IMPORTED)
            return
        replies.write(json.dumps(answer(message)) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
