"""Artifacts of runs (docs/design/artifacts.md): files a job uploads for later jobs and for the operator,
on the blob store, with their test reports."""
