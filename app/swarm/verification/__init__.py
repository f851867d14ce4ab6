"""Peers' rollouts checked before they count: what travels, what was announced, what each peer delivered. No libp2p here (tests/test_swarm_layers.py checks)."""
