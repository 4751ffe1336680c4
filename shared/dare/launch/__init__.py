"""Launching runs: Ray worker groups for multi-process training (`ray_group`); submitit sweeps
arrive with the sweep issue."""
