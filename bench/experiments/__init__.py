"""One-off A/B experiments behind design decisions; see README.md."""
