"""Where things are: the checkout, the tests' own folders, fixture trees and golden pages."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
SRC = ROOT / "src"
SUPPORT = TESTS / "support"
FIXTURES = TESTS / "fixtures"  # sysfs/procfs trees, vendor data
FAKES = TESTS / "fakes"  # the vendor libraries' doubles
GOLDEN = TESTS / "golden"  # expected pages (UPDATE_GOLDEN=1 rewrites them)
