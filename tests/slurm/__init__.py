"""Tests for the Slurm parsers and the local-cluster harness."""
