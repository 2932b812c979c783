"""The parts of tiering the simulator builds on, imported in this one place:
the planner tier-run's clairvoyant policy runs, the profile loader, the
catalog scan and the sampler orders."""
from __future__ import annotations

from ..catalog import CatalogError, ScanError, scan
from ..clairvoyant.options import RANKED, OrderOptions, StreamError, epochs_from_options
from ..clairvoyant.planner import Action, Planner, allocation
from ..clairvoyant.planner import simulate as plan_simulate
from ..clairvoyant.samplers import OrderError, SamplerSpec, epoch_order
from ..profile import Profile, ProfileError, load_profile
from ..profile.model import DEFAULT_PFS_MB_S
from ..units import human_bytes

__all__ = ["DEFAULT_PFS_MB_S", "RANKED", "Action", "CatalogError", "OrderError", "OrderOptions", "Planner", "Profile",
           "ProfileError", "SamplerSpec", "ScanError", "StreamError", "allocation", "epoch_order",
           "epochs_from_options", "human_bytes", "load_profile", "plan_simulate", "scan"]
