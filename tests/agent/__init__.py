"""Tests of the node agent (no Django, no database)."""
