"""The store keys of what is measured on a mesh for any model: the devices' signature every key
holds (the profile's too, ``profile/keys.py``), and the collective cost model's key. A key's
fields are the store's format: change one and every entry keyed by it is measured again."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax

if TYPE_CHECKING:
    from jax.sharding import Mesh


def device_signature(mesh: Mesh) -> str:
    d = mesh.devices.flat[0]
    return f"{d.platform}:{getattr(d, 'device_kind', '?')}x{mesh.devices.size}/{jax.process_count()}proc"


# The collective cost model (calibrate.py) has a version of its own: bump it when what
# calibration measures changes. It is not the profile's PROFILE_VERSION, so changing how segments
# are profiled does not recalibrate the collectives, nor the other way round.
COLLECTIVE_MODEL_VERSION = 1


def collective_model_key(mesh: Mesh) -> dict:
    """The key of the collective cost model of ``mesh``: it depends on the mesh's shape,
    the device kind and count and the process count (``device_signature``), not on any model."""
    return {"version": COLLECTIVE_MODEL_VERSION, "kind": "collective-model", "mesh": list(mesh.devices.shape),
            "devices": device_signature(mesh)}
