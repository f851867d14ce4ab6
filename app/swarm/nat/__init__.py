"""Behind a home router: can peers dial this node (a helper's dial-back), and relay slots on helpers when they cannot."""
