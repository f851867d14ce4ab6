"""The swarm: what travels between nodes, and how a node admits what it receives."""
