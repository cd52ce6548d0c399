"""Every classic HTTP/2 attack against one real `meshbridge serve` (native transport).

For each attack (testkit/attacks/attackers.py, its own process, until it has its
answer; 3 s of observation at least) while endpoints change every ~0.5 s:
  (a) /ready answers 200 at every poll (each may take up to 20 s on a loaded machine);
  (b) the good clients (a Linkerd Get stream, an ADS SotW stream) get every change
      (each within 30 s) -- latencies are printed, never compared;
  (c) within 5 s after the attack, RSS is back within 20 MiB of the baseline (for the
      attacks that once left memory behind: after each of three runs in a row, within
      20 MiB of where the first started);
  (d) the attacker got what its budget (testkit/attacks/budgets.py) promises;
  (e) where the budget says so, the HTTP/2 stream and handler-task gauges come back
      to their baseline.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.attacks.budgets import ATTACKS, verdict
from testkit.attacks.harness import Report, Server, missing_flags, run_attack


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(Path(tmp_path_factory.mktemp("attacks")), "native")
    srv.start()
    yield srv
    srv.stop()


def describe(report: Report) -> str:
    missing = missing_flags()
    return report.text() + (f"\n  server flags not yet in `meshbridge serve`: {missing}"
                            if missing else "")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(ATTACKS))
async def test_server_withstands(server: Server, name: str) -> None:
    budget = ATTACKS[name]
    reference = 0
    for run in range(1, budget.repeat + 1):
        report = await run_attack(server, name, budget.seconds, budget.args,
                                  check_gauges=budget.gauges, rss_reference=reference)
        reference = reference or report.rss_baseline
        print(f"run {run} of {budget.repeat}: " + describe(report))
        problems = report.health_problems(budget.gauges) + verdict(budget, report.attacker)
        assert not problems, (f"{name} (run {run} of {budget.repeat}):\n  - "
                              + "\n  - ".join(problems) + "\n" + describe(report))
