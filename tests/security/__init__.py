"""Attack surface: settings, SSRF, injection, audit immutability (issue 8)."""
