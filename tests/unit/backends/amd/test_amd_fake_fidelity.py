"""The fake amdsmi must say what the real package says: same function names and parameters, same enum
values, same exception classes. The real package cannot be imported without ROCm, so its source is read
with ``ast`` from the installed files."""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
from enum import IntEnum
from pathlib import Path

import pytest

from gpu_exporter.backends.amd import backend as amd
from tests.fakes import fake_amdsmi
from tests.fakes.fake_amdsmi import FakeAmdSmi

_spec = importlib.util.find_spec("amdsmi")
if _spec is None or _spec.origin is None:  # pragma: no cover - amdsmi is a test dependency here
    pytest.skip("the amdsmi package is not installed", allow_module_level=True)
PACKAGE = Path(_spec.origin).parent


@functools.cache
def parse(name: str) -> ast.Module:
    return ast.parse((PACKAGE / name).read_text(encoding="utf-8"))


@functools.cache
def real_functions() -> dict[str, list[str]]:
    return {
        node.name: [a.arg for a in node.args.args]
        for node in parse("amdsmi_interface.py").body
        if isinstance(node, ast.FunctionDef)
    }


@functools.cache
def wrapper_constants() -> dict[str, int]:
    out: dict[str, int] = {}
    for node in parse("amdsmi_wrapper.py").body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, int)
        ):
            out[node.targets[0].id] = node.value.value
    return out


@functools.cache
def real_enums() -> dict[str, dict[str, int]]:
    constants = wrapper_constants()
    enums: dict[str, dict[str, int]] = {}
    for node in parse("amdsmi_interface.py").body:
        if not isinstance(node, ast.ClassDef):
            continue
        members: dict[str, int] = {}
        for item in node.body:
            if isinstance(item, ast.Assign) and isinstance(item.targets[0], ast.Name):
                value = item.value
                if isinstance(value, ast.Attribute) and value.attr in constants:
                    members[item.targets[0].id] = constants[value.attr]
                elif isinstance(value, ast.Constant) and isinstance(value.value, int):
                    members[item.targets[0].id] = value.value
        enums[node.name] = members
    return enums


FAKE_FUNCTIONS = sorted(n for n in dir(FakeAmdSmi) if n.startswith("amdsmi_"))


@pytest.mark.parametrize("name", FAKE_FUNCTIONS)
def test_fake_function_exists_in_the_real_package_with_the_same_parameters(name):
    real = real_functions()
    assert name in real, f"amdsmi has no {name}"
    fake_params = [p for p in inspect.signature(getattr(FakeAmdSmi, name)).parameters if p != "self"]
    assert len(fake_params) == len(real[name]), (fake_params, real[name])


def test_every_function_the_backend_calls_is_faked_and_real():
    source = Path(amd.__file__).read_text(encoding="utf-8")
    called = {
        node.args[1].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "_call"
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
    }
    assert called, "found no library calls in the backend"
    assert called <= set(real_functions())
    assert called <= set(FAKE_FUNCTIONS)


@pytest.mark.parametrize(
    "enum",
    [n for n, v in vars(fake_amdsmi).items() if isinstance(v, type) and issubclass(v, IntEnum) and v is not IntEnum],
)
def test_fake_enum_values_match_the_real_ones(enum):
    real = real_enums()[enum]
    for member, value in getattr(fake_amdsmi, enum).__members__.items():
        assert real[member] == value, f"{enum}.{member}"


def test_fake_exceptions_have_the_real_hierarchy():
    real = {
        node.name: [b.id for b in node.bases if isinstance(b, ast.Name)]
        for node in parse("amdsmi_exception.py").body
        if isinstance(node, ast.ClassDef)
    }
    for name in (
        "AmdSmiLibraryException",
        "AmdSmiRetryException",
        "AmdSmiTimeoutException",
        "AmdSmiParameterException",
    ):
        fake_base = getattr(fake_amdsmi, name).__bases__[0].__name__
        assert real[name] == [fake_base], name
    assert fake_amdsmi.AmdSmiLibraryException(2).get_error_code() == wrapper_constants()["AMDSMI_STATUS_NOT_SUPPORTED"]


def test_backend_status_codes_are_the_library_ones():
    constants = wrapper_constants()
    for name in (
        "NOT_SUPPORTED",
        "NOT_YET_IMPLEMENTED",
        "NO_PERM",
        "NOT_FOUND",
        "NOT_INIT",
        "DRIVER_NOT_LOADED",
        "AMDGPU_RESTART_ERR",
    ):
        assert getattr(amd, f"STATUS_{name}") == constants[f"AMDSMI_STATUS_{name}"], name
