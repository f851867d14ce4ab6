"""swarmling node."""
