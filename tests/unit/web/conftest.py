"""The web tests' fixtures: one set of certificates per session (``tls``) and the endpoint in process
(``serve``), from tests/support/."""

from tests.support.tls import tls
from tests.support.web import serve

__all__ = ["serve", "tls"]
