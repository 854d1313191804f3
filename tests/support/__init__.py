"""Shared test helpers: the only place tests get log dirs, daemons, brokers and terminals from."""
