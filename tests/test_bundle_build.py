"""The build's own decisions, without building: which pins a platform gets, what the closure check
catches, how a universal macOS binary is cut to one architecture, what is pruned."""

from __future__ import annotations

import importlib.util
import struct
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def build():
    spec = importlib.util.spec_from_file_location("akm_bundle_build", ROOT / "bundle" / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_pins_give_each_platform_its_versions(build):
    pins = build.Pins(
        [
            ("cryptography", "48.0.1", '(sys_platform == "darwin" and platform_machine == "x86_64")'),
            ("cryptography", "50.0.2", '(sys_platform == "linux" and platform_machine == "x86_64")'),
            ("mcp", "2.3.0", ""),
        ],
        [11, 12],
        "h",
    )
    assert pins.for_target(build.TARGETS["macos-x86_64"]) == {"cryptography": "48.0.1", "mcp": "2.3.0"}
    assert pins.for_target(build.TARGETS["linux-x86_64"]) == {"cryptography": "50.0.2", "mcp": "2.3.0"}
    assert pins.for_target(build.TARGETS["linux-aarch64"]) == {"mcp": "2.3.0"}


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
            f"Requires-Dist: {r}\n" for r in requires
        )
        zf.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    return path


def test_closure_check_evaluates_markers_and_extras_per_interpreter(build, tmp_path):
    wheels = {
        "mcp": _wheel(
            tmp_path,
            "mcp",
            "2.3.0",
            ["pyjwt[crypto]>=2.10", "anyio>=4.10; python_version >= '3.14'", "pywin32>=311; sys_platform == 'win32'"],
        ),
        "pyjwt": _wheel(tmp_path, "pyjwt", "2.15.1", ["cryptography>=3.4; extra == 'crypto'"]),
        "anyio": _wheel(tmp_path, "anyio", "4.9.0", []),
    }
    linux = build.TARGETS["linux-x86_64"]
    assert build.check_closure(["mcp>=2.0"], wheels, build.marker_env(linux, 11)) == [
        'cryptography>=3.4; extra == "crypto" is not pinned'
    ]
    wheels["cryptography"] = _wheel(tmp_path, "cryptography", "50.0.2", [])
    assert build.check_closure(["mcp>=2.0"], wheels, build.marker_env(linux, 11)) == []
    assert build.check_closure(["mcp>=2.0"], wheels, build.marker_env(linux, 14)) == [
        'anyio>=4.10; python_version >= "3.14" is pinned at 4.9.0'
    ]


def _macho(cpu: int, body: bytes) -> bytes:
    return b"\xcf\xfa\xed\xfe" + struct.pack("<i", cpu) + body


def test_universal_binary_is_cut_to_the_targets_slice(build):
    x86, arm = _macho(0x01000007, b"x86 code"), _macho(0x0100000C, b"arm code!")
    header = b"\xca\xfe\xba\xbe" + struct.pack(">I", 2)
    first = len(header) + 2 * 20
    fat = (
        header
        + struct.pack(">iiIII", 0x01000007, 3, first, len(x86), 0)
        + struct.pack(">iiIII", 0x0100000C, 0, first + len(x86), len(arm), 0)
        + x86
        + arm
    )
    assert build.thin_macho(fat, 0x01000007, "w") == x86
    assert build.thin_macho(fat, 0x0100000C, "w") == arm
    assert build.thin_macho(x86, 0x0100000C, "w") == x86  # not universal: unchanged
    with pytest.raises(build.BuildError, match="without a slice"):
        build.thin_macho(fat, 0x12, "w")


@pytest.mark.parametrize(
    "rel, pruned",
    [
        ("yaml/_yaml.cpython-312-x86_64-linux-gnu.so", True),
        ("yaml/__init__.py", False),
        ("cffi/api.py", True),
        ("_cffi_backend.cpython-312-x86_64-linux-gnu.so", False),
        ("jsonschema/tests/test_validators.py", True),
        ("pydantic/py.typed", True),
        ("pydantic-2.14.4.dist-info/RECORD", True),
        ("pydantic-2.14.4.dist-info/METADATA", False),
        ("opentelemetry_api-1.45.2.dist-info/entry_points.txt", False),
        ("certifi-2026.10.19.post1.dist-info/licenses/LICENSE", False),
        ("certifi/cacert.pem", False),
    ],
)
def test_prune_rules(build, rel, pruned):
    assert (build.prune_reason(rel) is not None) == pruned
