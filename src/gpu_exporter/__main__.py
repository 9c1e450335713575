from gpu_exporter.cli import entry

entry()
