"""protocols package."""
