"""Reinforcement learning over live sandboxed episodes (``explorer rl``): rounds of sampling with
the current adapter, rewards from the project's metrics and detectors, group-relative advantages,
and a clipped policy-gradient update on exactly the tokens sampled. ``rl.run`` is the workflow."""
