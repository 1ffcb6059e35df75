"""Slurm integration: pure parsers for squeue/sacct/scontrol/sinfo/slurmrestd outputs."""
