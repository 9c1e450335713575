"""Cloud bridge: MQTT batches from edge nodes to Prometheus remote write."""
