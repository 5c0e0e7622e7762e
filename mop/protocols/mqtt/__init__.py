"""mqtt package."""
