"""Chaos: a fault-injection harness that checks the invariants of a whole cluster under load (docs/chaos.md).

`python -m chaos --duration SECONDS --seed N` starts two coordinators on one PostgreSQL database, two
database-less workers, connected and scaler-spawned agents and a webhook load, injects a seeded schedule of
faults, then checks the recorded history and the final database against the invariants of `chaos.checker`.
"""
