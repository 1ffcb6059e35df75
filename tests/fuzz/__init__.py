"""Property-based fuzzing of every parser (issue 8)."""
