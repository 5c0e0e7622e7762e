"""End-to-end tests of separated deployments: proxies in front of broker processes."""
