"""The wire format: the batch payload (version 3, reading versions 1 and 2 too), the bytes a batch of
samples travels as, and back.

One package holds both directions so that they cannot drift apart. The document is JSON, sent compressed
with zlib and a preset dictionary (``_zdict.py``: the JSON skeleton and catalog keys, so that even the
first occurrence of a key costs a back-reference), or plain, for debugging; version 1 agents sent gzip.
A reader tells them apart by the first bytes (``78``, ``1f 8b`` or ``{``). The document is columnar:
each device's labels, and each metric's key, appear once per batch, and the values of a series over the
batch's samples form one column. Columns of decimal numbers (integer percent, milliwatts, MHz, bytes...)
are stored as scaled integer deltas (or deltas of deltas, where shorter), a column that holds still as
its one value, and a column that moves in step with an earlier one of the same device (memory free
against memory used) as a reference to it. The full description is docs/payload.md; the JSON Schema is
``payload.schema.json`` in this package.

``decode`` trusts nothing: anything malformed raises :class:`PayloadError` (one line a log can carry),
never another exception, and the size of the input and of the inflated document is bounded.

The public API, which the forwarder, the bridge, ``tail`` and the tools import from here:
``types.py`` (the batch and its header), ``encode.py`` (batch to bytes), ``decode.py`` (bytes to batch:
``decode``, ``verify``, ``peek``), built on ``frame.py`` (the bounded inflater and JSON parser) and
``document.py`` (the document's validators and the schema). ``split.py`` cuts a batch into parts that fit
a size limit; ``columns.py`` is the bridge's columnar reader, which decodes with the same validators.
"""

from gpu_exporter.payload import types
from gpu_exporter.payload.decode import decode, peek, verify
from gpu_exporter.payload.document import from_document, schema
from gpu_exporter.payload.encode import encode, to_document
from gpu_exporter.payload.types import *  # noqa: F403 - the batch types and the format's constants

__all__ = [*types.__all__, "decode", "encode", "from_document", "peek", "schema", "to_document", "verify"]
