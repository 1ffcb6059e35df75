"""STUB: being built."""
