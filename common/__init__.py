"""What every BEAR service shares: the Redis configuration and the names of what lives in Redis."""
