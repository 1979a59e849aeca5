"""``ckpt-events watch`` over a crowd of participants: thousands of URLs polled at once took this
process's CPU past the polls' deadlines, so participants that refused the connection at once were
named 'no answer within 0.3 s' (1,269 of 3,000; 8,855 of 10,000 at the default 1 s through the
command): a false diagnosis. Polls now run ``MAX_POLLS`` at a time, each on the clock from its
turn, and every one is named for what happened to it."""

from __future__ import annotations

import socket
from collections import Counter

from ckpt_events.participants.cli.watch.sources import MAX_POLLS, poll_all, status_client

#: Participants in the crowd: well past MAX_POLLS, so the slots are what keeps the deadlines true.
_CROWD = 3_000


async def test_a_crowd_refusing_connections_is_named_unreachable_not_slow() -> None:
    """3,000 URLs on a port bound but not listening (each connection refused at once), polled in
    one round at 0.3 s: every one is 'unreachable', none 'no answer within 0.3 s'."""
    assert _CROWD > 4 * MAX_POLLS
    with socket.socket() as closed:  # bound, never listening: the port is ours and refuses
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        urls = [f"http://127.0.0.1:{port}/p{i}" for i in range(_CROWD)]
        async with status_client(urls, headers={}, timeout=0.3) as client:
            results = await poll_all(client, urls, 0.3)
    said = Counter((r.error or "answered").split(":")[0] for r in results)
    assert said == {"unreachable": _CROWD}
    assert [r.url for r in results] == urls
