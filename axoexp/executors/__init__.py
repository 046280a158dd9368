"""Executors: how one update runs. ``base`` defines the contract; each other module
registers one executor when :mod:`axoexp.plugins` imports it."""
