"""The LISTEN/NOTIFY channel names, in the lowest package that every sender and listener may import.

A channel is a contract between packages of one layer (`secrets` tells `ingest`'s source cache a webhook
secret changed), so its name lives here rather than in either of them (docs/design/ARCHITECTURE.md §3).
NOTIFY is only ever a hint: every consumer also polls (`conveyor.db.listen`).
"""

# A job was queued: wakes the dispatchers.
DISPATCH_CHANNEL = "conveyor_dispatch"
# A job went `cancelling`: the coordinator holding its agent sends `job.cancel` at once instead of at its
# next poll.
CANCEL_CHANNEL = "conveyor_cancel"
# Log lines of a job (payload: its id) were stored: wakes the readers that follow it.
LOGS_CHANNEL = "conveyor_logs"
# A webhook source or one of its secrets changed (payload: its id, or `*`): drops it from every
# coordinator's source cache.
SOURCE_CHANNEL = "conveyor_source_changed"
# An internal event was stored (payload: its id): wakes the event drainers.
EVENTS_CHANNEL = "conveyor_events"
