"""The `conveyor` command line."""
