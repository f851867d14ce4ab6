"""The node's libp2p host and the swarm's protocols on it: dialling, admission, bundles, gossip, supervision."""
