"""Backend classes by `type` (what `scalers.yaml` may name)."""

from __future__ import annotations

import importlib

from conveyor.scaler.backend import ScalerBackend

# type → (module, class); every backend module of this package.
BACKENDS = {
    "bare-metal": ("conveyor.scaler.bare_metal", "BareMetalBackend"),
    "container": ("conveyor.scaler.container", "ContainerBackend"),
    "firecracker": ("conveyor.scaler.firecracker", "FirecrackerBackend"),
    "event": ("conveyor.scaler.event", "EventBackend"),
}


def backend_registry() -> dict[str, type[ScalerBackend]]:
    """Every backend class by type."""
    registry: dict[str, type[ScalerBackend]] = {}
    for kind, (module_name, class_name) in BACKENDS.items():
        module = importlib.import_module(module_name)
        registry[kind] = getattr(module, class_name)
    return registry
