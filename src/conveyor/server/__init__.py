"""The server: config, app assembly, start-up and shut-down order (docs/design/ARCHITECTURE.md §3)."""
