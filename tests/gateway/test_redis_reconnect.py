"""After Redis restarts, the gateway's first commands on its pooled connections succeed.

Found by the soak (``bench/soak/``): without a retry, every connection pooled before
a Redis restart failed its next command ("Connection closed by server", "Connection lost
while writing"), so the gateway answered 503 "Redis unavailable" to single requests up
to 80 s after Redis was back. One retry on a fresh connection fixes it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from preft_serve.common.registry_client.aio import connect_redis
from tests.support.redis_process import RedisProcess


def test_pooled_connections_survive_a_redis_restart(tmp_path: Path) -> None:
    server = RedisProcess(tmp_path).start()

    async def scenario() -> list[str | None]:
        client = connect_redis(server.url)
        # Several pooled connections, as under concurrent requests.
        await asyncio.gather(*(client.set(f"k{i}", str(i)) for i in range(8)))
        server.kill()
        server.start()
        try:
            return list(await asyncio.gather(*(client.get(f"k{i}") for i in range(8))))
        finally:
            await client.aclose()

    try:
        assert asyncio.run(scenario()) == [str(i) for i in range(8)]  # from the AOF
    finally:
        server.stop()


def test_the_registrys_blocking_client_survives_a_redis_restart(tmp_path: Path) -> None:
    """The registry and the blocking registry client connect with the same one retry."""
    from preft_serve.common.registry_client.sync import connect_redis as connect_blocking

    server = RedisProcess(tmp_path).start()
    client = connect_blocking(server.url)
    try:
        pool = [client.connection_pool.get_connection() for _ in range(4)]
        for connection in pool:  # several pooled connections, as under concurrent requests
            client.connection_pool.release(connection)
        for i in range(4):
            client.set(f"k{i}", str(i))
        server.kill()
        server.start()
        assert [client.get(f"k{i}") for i in range(4)] == [str(i) for i in range(4)]
    finally:
        client.close()
        server.stop()
