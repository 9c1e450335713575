"""The converter's refusals (series limits, the value policy, identity strings, unknown metric keys),
counted per node and reason and logged at most once a minute per kind."""

from __future__ import annotations

import logging

from gpu_exporter.bridge.convert import Converted
from gpu_exporter.bridge.limits import RateLog
from gpu_exporter.bridge.metrics import BridgeMetrics, NodeNames
from gpu_exporter.bridge.settings import BridgeSettings
from gpu_exporter.bridge.values import RESET_AFTER

__all__ = ["Refusals"]

log = logging.getLogger("gpu_exporter.bridge.service")


class Refusals:
    """Counts and logs what one conversion refused. The writer's (not thread-safe)."""

    def __init__(self, settings: BridgeSettings, metrics: BridgeMetrics, nodes: NodeNames, ratelog: RateLog) -> None:
        self.settings = settings
        self.metrics = metrics
        self.nodes = nodes
        self.log = ratelog
        self._unknown_logged: set[str] = set()

    def count(self, converted: Converted, active_series: int) -> None:
        """The converter's refusals, counted and logged (at most a line a minute per kind)."""
        for key in converted.unknown_keys:
            self._warn_unknown(key)
        for (node, why), values in converted.limited.items():
            label = self.nodes.label(node)
            self.metrics.series_limited.labels(label, why).inc(values)
            limit = "max-series-per-node" if why == "node" else "max-series"
            bound = self.settings.max_series_per_node if why == "node" else self.settings.max_series
            self.log.warning(
                "limit:" + why,
                "%s reached --bridge.%s=%d active series; values of further series are dropped "
                "(see gpu_exporter_bridge_series_limited_total)",
                f"node {label}" if why == "node" else "the fleet",
                limit,
                bound,
            )
        for (node, reason), values in converted.dropped.items():
            label = self.nodes.label(node)
            if reason == "counter_reset":
                self.log.warning(
                    "counter_reset",
                    "node %s: a counter stayed below its earlier value for %d batches: taken as a reset within "
                    "the agent's boot (a GPU reset or driver reload)",
                    label,
                    RESET_AFTER,
                )
                continue
            self.metrics.values_dropped.labels(label, reason).inc(values)
            self.log.warning(
                "values:" + reason,
                "dropped %d %s value(s) of node %s (docs/bridge.md, Values; see gpu_exporter_bridge_values_dropped_total)",
                values,
                reason,
                label,
            )
        for (node, reason), keys in converted.labels_dropped.items():
            label = self.nodes.label(node)
            self.metrics.labels_dropped.labels(label, reason).inc(keys)
            self.log.warning(
                "labels:" + reason,
                "left %d identity string(s) of node %s out of gpu_info: %s (see gpu_exporter_bridge_labels_dropped_total)",
                keys,
                label,
                reason,
            )
        self.metrics.active_series.set(active_series)

    def _warn_unknown(self, key: str) -> None:
        if key not in self._unknown_logged:
            self._unknown_logged.add(key)
            log.warning(
                "metric key %r is not in this bridge's catalog; its values are skipped "
                "(is the exporter newer than the bridge?)",
                key,
            )
