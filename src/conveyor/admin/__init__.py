"""Admin tokens, the guard, the access log, pagination, offline bootstrap (docs/design/ARCHITECTURE.md §3)."""
