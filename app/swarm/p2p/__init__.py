"""The libp2p parts everything above builds on: a trio thread, stream helpers, addresses, identity, the peerstore, the counting transport."""
