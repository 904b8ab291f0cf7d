"""Test support: free ports, a real redis-server, real service processes."""
