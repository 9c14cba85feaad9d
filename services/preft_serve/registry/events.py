"""Publishing change events inside the same Redis transaction as the change itself.

One Lua call appends the event to the stream (assigning its id, the catch-up cursor) and
publishes it, id included, on the live channel. Queued inside MULTI/EXEC, the event
exists if and only if the change does. The format is
:class:`preft_serve.common.registry_client.RegistryEvent`.
"""

from __future__ import annotations

from typing import Any

from preft_serve.common.registry_client import RegistryEvent, RegistryKeys

_EMIT_LUA = """
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', unpack(ARGV, 2))
local event = {id = id}
for i = 2, #ARGV, 2 do event[ARGV[i]] = ARGV[i + 1] end
redis.call('PUBLISH', KEYS[2], cjson.encode(event))
return id
"""


def queue_event(pipe: Any, keys: RegistryKeys, event: RegistryEvent, maxlen: int) -> None:
    """Add ``event`` to a pipeline (normally in MULTI mode, after the change it describes)."""
    args: list[str | int] = [maxlen]
    for field, value in event.fields().items():
        args += [field, value]
    pipe.eval(_EMIT_LUA, 2, keys.events, keys.channel, *args)
