"""The tests' one HTTP client.

`httpx.get()` and friends build a client per call, and a client loads the CA bundle into a new SSL context
(about 30 ms of CPU) even for plain `http://`: the suite's waits poll servers every 50 ms, so that load was
most of the CPU the test processes spent. One client serves every call instead. It keeps no idle
connections: a test restarts servers on the same port, and a pooled connection to the one that died would
fail the next request.
"""

from __future__ import annotations

import httpx

HTTP = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))  # httpx.get's 5 s timeout
