"""Ingest: sources, durable webhook intake, and the pipeline from a delivery to runs."""
