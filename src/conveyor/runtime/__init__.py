"""Runtime core: instance identity, the leader lease and leader-only tasks, cluster and org settings.

What other packages use, from a started server's `state.parts`:

- `runtime_services(state.parts).settings` — `SettingsResolver`: `await .cluster_value(name)`,
  `await .org_value(org_id, name)` (org > cluster > env/YAML default > built-in), through a short cache.
- `runtime_services(state.parts).leadership` — `Leadership`: `.register(LeaderTask(name,
  interval_ms, run))`; `run(context)` gets a `LeaderContext` whose `fence(conn)` /
  `fenced_transaction()` guard every leader-only write with the lease epoch.
- `runtime_services(state.parts).identity` — this node's `instance_id`, `boot_id` and role.
"""

from conveyor.runtime.boot import RuntimeServices, runtime_services
from conveyor.runtime.instances import Identity
from conveyor.runtime.lease import LeaderContext, Leadership, LeaderTask, LeaseLost
from conveyor.runtime.settings import (
    ClusterSettingsView,
    OrgSettingsView,
    SettingsResolver,
    classify_settings_version,
    resolve_setting,
)

__all__ = [
    "ClusterSettingsView",
    "Identity",
    "LeaderContext",
    "LeaderTask",
    "Leadership",
    "LeaseLost",
    "OrgSettingsView",
    "RuntimeServices",
    "SettingsResolver",
    "classify_settings_version",
    "resolve_setting",
    "runtime_services",
]
