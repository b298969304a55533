"""Source providers: how each kind of source parses deliveries, reads the lock file and reports status."""
