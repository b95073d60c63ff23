"""Event streams (SPEC §18): GET /evaluate/{id}/events and GET /batches/{id}/events.

- ``announce``: the writers' side. After a transition, a test result or a batch's end commits,
  a datagram to every web process's hub on this host (and NOTIFY on PostgreSQL).
- ``hub``: one thread per web process that receives those and wakes only the streams that care.
- ``slots``: MAX_EVENT_STREAMS for the whole host and MAX_EVENT_STREAMS_PER_TOKEN per tenant, as flock'd
  files the kernel frees with a dead process.
- ``cursor``: event ids, cursors any web process can resume from (no state kept on the server).
- ``stream``: what a stream reads and sends, and when.
- ``datagrams``: the datagram sockets in a folder that the hubs and the worker's wake-up
  (worker/wakeup.py) both use.

docs/events.md has the protocol; the README says how streams stay off the API's threads.
"""
