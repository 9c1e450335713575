"""The send time of a batch, carried in MQTT 5 PUBLISH properties rather than in the payload.

A batch is encoded and compressed once, when it is closed, and may sit in the spool for hours before it
is published; a time inside the payload would say when it was closed, not when it was sent, and
stamping it at publish time would mean inflating, editing and compressing every batch again. So the
agent stamps the PUBLISH packet instead, at the moment it hands the batch to the broker:

* user property ``sent``: the agent's wall clock, milliseconds since the Unix epoch, in decimal;
* Message Expiry Interval ``EXPIRY_S`` (ten years, which expires nothing in practice): the broker must
  forward it reduced by the whole seconds it held the message, so the bridge can tell how long a batch
  waited in the broker (a bridge outage, a full in-flight window) and not mistake that for clock skew.

MQTT 3.1.1 has no properties: batches from such agents carry no send time, and the bridge can then only
refuse their samples that lie in its own future (docs/bridge.md). A bridge that predates this ignores
both properties.
"""

from __future__ import annotations

import time

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

__all__ = ["EXPIRY_S", "PACKED_MAX", "SENT", "properties"]

SENT = "sent"
EXPIRY_S = 10 * 365 * 86400


def properties(now: float | None = None) -> Properties:
    """PUBLISH properties that stamp a batch with the agent's clock at the moment of publishing."""
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.UserProperty = [(SENT, str(time.time_ns() // 1_000_000 if now is None else round(now * 1000)))]
    props.MessageExpiryInterval = EXPIRY_S
    return props


# Bytes the stamp adds to a PUBLISH, its length field included, for a send time of up to 14 digits (the
# year 5138): what mqtt/packet.py counts against the broker's Maximum Packet Size.
PACKED_MAX = len(properties(now=99_999_999_999.999).pack())  # type: ignore[no-untyped-call]
