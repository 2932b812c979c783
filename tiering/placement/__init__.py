"""Placement: the shared index (index), the daemon that copies files onto the
tiers and publishes them (daemon, tiers), the contract between the daemon and
its policies (api) and the policies that need no order (policies)."""
