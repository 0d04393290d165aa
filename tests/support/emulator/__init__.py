"""The Kubernetes API emulator of the tests (see :mod:`.server`)."""

from tests.support.emulator.resources import kopf_peering_crds
from tests.support.emulator.server import KubeEmulator

__all__ = ["KubeEmulator", "kopf_peering_crds"]
