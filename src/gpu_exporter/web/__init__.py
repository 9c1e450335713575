"""The HTTP endpoint of the agent and the bridge: limits, TLS, basic auth (``--web.*`` options)."""
