"""``rocketstore console``: a read-only web console served from a store root's files.

Modules, one job each:

* :mod:`.server`: the ``console`` command (options, the socket, uvicorn, Ctrl-C);
* :mod:`.app`: the Starlette application, its routes and templates;
* :mod:`.auth`: the token every request carries when the console is reachable off the host;
* :mod:`.params`: validation of every request parameter;
* :mod:`.views`: what each page shows, gathered through the store's own readers;
* :mod:`.rates`: messages per minute from sampled store timestamps;
* :mod:`.charts`: those figures drawn as inline SVG (matplotlib);
* :mod:`.health`: ``verify`` runs started from the page, in a background thread.

Nothing here writes to a store or takes its lock: brokers are opened read-only per request,
as ``rocketstore queues`` opens them, and closed before the response is sent.

Only :mod:`.server` may be imported without the ``console`` extra (starlette, jinja2, uvicorn,
matplotlib); it says what to install when they are missing.
"""

from __future__ import annotations
