"""The soak test's clients, in a process of their own so that the server's memory is
the server's alone: `python -m tests.reliability.soak_clients SERVER COUNT SERVICES`.

A fleet of mixed followers (testkit/fleet.py); every second a few of them
drop their connection's stream and open a new one, as restarting proxies do. Commands
on stdin, answers on stdout (JSON lines): `report` -> every follower's target and
state; end of input -> stop."""

from __future__ import annotations

import asyncio
import json
import random
import sys

from testkit.fleet import Fleet, Follower
from testkit.processes import commands, out_line
from tests.reliability.support import sim_cluster, target


async def main(server: str, count: int, services: int) -> int:
    sim = sim_cluster(services=services)
    fleet = Fleet(server, count, lambda i: target(i, sim), channels=10)
    fleet.start()
    rng = random.Random(5)

    async def restart_some() -> None:
        while True:
            await asyncio.sleep(1.0)  # the pace of client restarts, not synchronisation
            for _ in range(max(1, count // 50)):
                i = rng.randrange(count)
                old = fleet.followers[i]
                await old.stop()
                new = Follower(old.channel, old.model, old.target, old.index)
                fleet.followers[i] = new
                new.start()

    restarts = asyncio.create_task(restart_some())
    reader = await commands()
    out_line(started=True)
    while (line := await reader.readline()):
        cmd = json.loads(line)
        if cmd.get("cmd") == "quiet":
            restarts.cancel()
            out_line(quiet=True)
        elif cmd.get("cmd") == "report":
            out_line(states=[[f.target, sorted(s) if (s := f.state()) is not None else None]
                             for f in fleet.followers])
    restarts.cancel()
    await fleet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
