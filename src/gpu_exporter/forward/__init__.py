"""Store-and-forward: batches of samples, a disk spool, and an MQTT publisher (see docs/payload.md)."""
