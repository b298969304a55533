"""The auto-scaler: spawns one-shot agents for queued jobs no connected agent can take
(docs/design/scaler.md)."""
