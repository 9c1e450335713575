"""tools/mutate.py stays runnable: every mutant's snippet is found once in its file, the mutated file
compiles, and every test a mutant names exists. Code moves (a refactor, tests into folders) break these
silently until someone runs the tool; here CI sees it."""

from __future__ import annotations

import importlib.util
import sys

from tests.support.paths import ROOT


def test_every_mutant_names_a_snippet_found_once_and_tests_that_exist() -> None:
    spec = importlib.util.spec_from_file_location("mutate_tool", ROOT / "tools" / "mutate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    try:
        spec.loader.exec_module(module)
        assert len(module.MUTANTS) >= 100
        assert module.check_snippets(list(module.MUTANTS)) == []
    finally:
        del sys.modules[spec.name]
