"""Fast and pure: the model, diagnosis, protocol, recording, collectors on loopback, the CLI's quick paths."""
