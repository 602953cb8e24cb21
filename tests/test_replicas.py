"""A rolling update of three replicas behind HAProxy under steady load loses nothing.

The short version of `python -m loadtest.experiments.replicas` (its `rolling` scenario): three real
servers (a tiny model) on 127.0.0.1, HAProxy health-checking `/readyz`, aiohttp sending a
steady 20 requests/s, while each replica is replaced as the chart's rolling update does it
(start the new one, wait until it is ready, take the old one out of rotation, preStop pause,
SIGTERM). Skipped when haproxy is not installed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from loadtest.experiments import haproxy
from loadtest.experiments.replicas import Ask, Tally, replica_set, roll, steady
from loadtest.servers import free_port

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(
        haproxy.haproxy_binary() is None,
        reason="haproxy is not installed (apt-get install -y haproxy)",
    ),
]

RATE = 20.0  # requests per second: a tiny model's replicas are far from busy
PRESTOP_S = 1.0


def test_rolling_update_behind_haproxy_answers_every_request(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    env = {"MODEL_ID": str(tiny_models["text-classification"])}
    old = [haproxy.Slot(f"r{i}", free_port()) for i in range(3)]
    new = [haproxy.Slot(f"n{i}", free_port()) for i in range(3)]
    ask = Ask("/", {"inputs": "paris is the capital of france"})
    with (
        replica_set([s.port for s in old], tmp_path, env) as replicas,
        haproxy.running([*old, *new], "leastconn", tmp_path / "haproxy") as proxy,
    ):
        for s in old:
            proxy.wait_status(s.name, "UP")
        for s in new:
            proxy.wait_status(s.name, "DOWN")

        async def scenario() -> tuple[list[int], Tally]:
            done = False
            load = asyncio.create_task(steady(proxy.url, "rolling", RATE, lambda: done, ask))
            codes = await asyncio.to_thread(
                roll, proxy, replicas, [*old, *new], tmp_path, PRESTOP_S, print, env
            )
            await asyncio.sleep(0.5)
            done = True
            return codes, await load

        codes, tally = asyncio.run(asyncio.wait_for(scenario(), 150))
        assert codes == [0, 0, 0], "each old replica drained and exited 0"
        assert tally.sent > 100
        assert tally.errors == []
        assert (tally.failed, tally.shed) == (0, 0)
        assert tally.answered == tally.sent
        status = proxy.status()
        assert [status[s.name] for s in new] == ["UP"] * 3
        assert [status[s.name] for s in old] == ["MAINT"] * 3
