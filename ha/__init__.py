"""ha: the replication layer (ownership, forwarding, persistence, failover; asyncio)."""
