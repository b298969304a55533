"""Runs, jobs and steps: creation from a match, the dispatch queue, scheduling, logs."""
