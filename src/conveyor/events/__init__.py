"""Internal events: the durable event store, the router with recorded outcomes, registrations and cron.

The reference is `docs/design/events.md`. `execution`, `agents` and `ingest` never import this package: the
start-up hook plugs its producers into them.
"""
