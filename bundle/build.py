"""Build dist/akm: one executable zipapp that runs on every supported CPython of one platform.

Why not plain shiv any more: the file must run on any CPython >= 3.11, so it carries each
interpreter's build of every native extension side by side (their file names differ by ABI tag) and
needs a runtime of its own (bundle/boot.py): import pure Python straight from the archive, unpack
only the native extensions the running interpreter imports. shiv's runtime does neither, and its
archive layout (packages under site-packages/) hides the packages' metadata from importlib.metadata
when imported from the archive, so nothing of shiv would be left but writing a zip file.

Steps: read the exact versions to bundle (bundle/pins.txt, re-resolved when pyproject.toml's
dependencies change or on --relock); fetch each supported CPython's wheels for the target platform
with pip (`download --platform/--python-version/--only-binary`) into a wheel cache; check that the
pins close over every dependency for each interpreter; unpack, prune what is never imported; pack
the native extensions into xz streams; write the archive with our runtime.
Usage: ./build.sh [--platform linux-x86_64|linux-aarch64|macos-x86_64|macos-arm64] [--relock]
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import io
import json
import lzma
import marshal
import os
import platform
import re
import struct
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pip._vendor.packaging.markers import Marker
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename
from pip._vendor.packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "bundle"
PINS = HERE / "pins.txt"
OLDEST = 11  # CPython 3.11: the oldest supported minor version
# Then a comment running into the zip's first bytes, with no newline: a file cut short has no zip
# directory at its end, so Python runs it as a script, and its error quotes the line with the first
# NUL byte. That line is then this sentence rather than a bare "PK".
SHEBANG = (b"#!/usr/bin/env python3\n# akm: if Python shows this line in an error, this file is cut short or "
           b"damaged (it is a zip archive, and its end is missing): download or build it again. ")
# 12 MiB until issue 38: OpenTelemetry tracing (SDK, OTLP/HTTP exporter, protobuf's pure-Python runtime) adds
# 0.38 MiB after pruning (its metrics and logs halves, the exporter's requests/urllib3 transport).
MAX_SIZE = 12 * 1024 * 1024 + 512 * 1024
# Builds of one extension for consecutive CPython versions share one xz stream, where each is coded
# as its differences from the one before (about half the size). Unpacking one decodes the stream up
# to it, so a chain of 3 bounds that to 3 builds (pydantic-core: 15 MB, ~0.2 s) for ~1.2 MB more
# than a single chain of all five.
CHAIN = 3


@dataclass(frozen=True)
class Target:
    """A platform dist/akm can be built for."""

    name: str
    pip_platform: str  # pip --platform (pip widens it to the older compatible tags)
    sys_platform: str
    machines: tuple[str, ...]  # os.uname().machine values it runs on
    suffix_tail: str  # extension suffix after "cpython-3XY"
    bcj: int | None  # xz branch filter for this machine code, if liblzma has had one forever
    macho_cpu: int | None = None  # Mach-O CPU type: the slice kept of a universal2 (fat) binary


TARGETS = {
    t.name: t
    for t in (
        Target("linux-x86_64", "manylinux2014_x86_64", "linux", ("x86_64",), "-x86_64-linux-gnu.so", lzma.FILTER_X86),
        Target("linux-aarch64", "manylinux2014_aarch64", "linux", ("aarch64",), "-aarch64-linux-gnu.so", None),
        Target("macos-x86_64", "macosx_10_15_x86_64", "darwin", ("x86_64",), "-darwin.so", lzma.FILTER_X86,
               0x01000007),
        Target("macos-arm64", "macosx_11_0_arm64", "darwin", ("arm64",), "-darwin.so", None, 0x0100000C),
    )
}

# What is never imported, so never shipped. tests/test_build_zipapp.py proves the rest still works by
# running the CLI and importing what `akm mcp` needs from the built file.
PRUNE_PREFIXES = {
    "cffi/": "cffi's Python half generates bindings; cryptography only loads the _cffi_backend extension",
    "pycparser/": "a C parser for cffi's binding generator",
    "_yaml/": "a shim re-exporting yaml._yaml",
    "yaml/_yaml.": "libyaml bindings: PyYAML falls back to its pure-Python parser, which akm's loader subclasses",
    "bin/": "console scripts of the dependencies",
    # Tracing (akm/telemetry, only when configured) exports spans with protobuf's pure-Python runtime, over
    # httpx (akm.dispatch.otlp_export gives the exporter its own transport): the compiled runtime and the
    # exporter's default transport (requests, urllib3, charset_normalizer) are never imported.
    "google/_upb/": "protobuf's compiled runtime: its pure-Python one encodes a span batch",
    "requests/": "the OTLP exporter's default transport: akm gives it one on httpx",
    "urllib3/": "the OTLP exporter's default transport: akm gives it one on httpx",
    "charset_normalizer/": "the OTLP exporter's default transport: akm gives it one on httpx",
    # googleapis-common-protos is a declared dependency of the OTLP exporter that its trace path never imports
    "google/api/": "googleapis-common-protos: not imported by the OTLP trace exporter",
    "google/cloud/": "googleapis-common-protos: not imported by the OTLP trace exporter",
    "google/gapic/": "googleapis-common-protos: not imported by the OTLP trace exporter",
    "google/logging/": "googleapis-common-protos: not imported by the OTLP trace exporter",
    "google/longrunning/": "googleapis-common-protos: not imported by the OTLP trace exporter",
    "google/rpc/": "googleapis-common-protos: not imported by the OTLP trace exporter",
    "google/type/": "googleapis-common-protos: not imported by the OTLP trace exporter",
    # OpenTelemetry (akm.telemetry): akm exports traces over OTLP/HTTP only. Its metrics and logs halves, their
    # protobuf messages and the semantic conventions it never names are not imported on that path.
    "opentelemetry/sdk/metrics/": "OpenTelemetry metrics: akm exports traces only",
    "opentelemetry/sdk/_logs/": "OpenTelemetry logs: akm exports traces only",
    "opentelemetry/sdk/_configuration/": "OpenTelemetry auto-configuration: akm configures its exporter itself",
    "opentelemetry/proto/logs/": "OTLP logs messages: akm exports traces only",
    "opentelemetry/proto/metrics/": "OTLP metrics messages: akm exports traces only",
    "opentelemetry/proto/profiles/": "OTLP profiles messages: akm exports traces only",
    "opentelemetry/proto/collector/logs/": "OTLP logs service: akm exports traces only",
    "opentelemetry/proto/collector/metrics/": "OTLP metrics service: akm exports traces only",
    "opentelemetry/proto/collector/profiles/": "OTLP profiles service: akm exports traces only",
    "opentelemetry/semconv/trace/": "deprecated semantic conventions: not imported",
    "opentelemetry/semconv/metrics/": "metric semantic conventions: not imported",
    "opentelemetry/semconv/_incubating/": "incubating semantic conventions the OTLP exporter does not import",
}
# Exceptions to PRUNE_PREFIXES: the files under a pruned prefix that the trace export does import.
PRUNE_KEEP = frozenset(
    {
        "opentelemetry/semconv/_incubating/__init__.py",
        "opentelemetry/semconv/_incubating/attributes/__init__.py",
        "opentelemetry/semconv/_incubating/attributes/otel_attributes.py",
        "opentelemetry/semconv/_incubating/metrics/__init__.py",
        "opentelemetry/semconv/_incubating/metrics/otel_metrics.py",
    }
)
PRUNE_DIRS = {"__pycache__", "tests", "benchmarks"}  # package test suites are never imported at run time
PRUNE_SUFFIXES = (".pyi", ".pyc", ".pyx", ".pxd", ".c", ".h", "py.typed")
DIST_INFO_KEEP = re.compile(r"^(METADATA|entry_points\.txt|top_level\.txt|licenses/.*|(LICEN[CS]E|COPYING|NOTICE|AUTHORS)[^/]*)$")
NATIVE = re.compile(r"\.(so|pyd|dylib)$|\.so\.")
EXTENSION = re.compile(r"^(?P<module>.+?)\.(?P<tag>cpython-3(?P<minor>\d+)[a-z]*-[^/]+\.so|abi3\.so)$")


def log(msg: str) -> None:
    print(f"build: {msg}", file=sys.stderr, flush=True)


class BuildError(Exception):
    pass


# ------------------------------------------------------------------ pins


@dataclass
class Pins:
    """bundle/pins.txt: `name==version` lines, with a marker where a platform needs another version
    (e.g. a release without wheels for it)."""

    entries: list[tuple[str, str, str]]  # (canonical name, version, marker or "")
    pythons: list[int]  # supported minor versions
    requirements_hash: str

    def for_target(self, target: Target) -> dict[str, str]:
        env = marker_env(target, OLDEST)
        return {n: v for n, v, m in self.entries if not m or Marker(m).evaluate(env)}

    def text(self) -> str:
        lines = [
            "# The exact distributions bundled into dist/akm, for CPython " + _range(self.pythons) + ".",
            "# Written by ./build.sh --relock (also run when pyproject.toml's dependencies change).",
            f"# pythons: {' '.join(f'3.{m}' for m in self.pythons)}",
            f"# requirements-hash: {self.requirements_hash}",
        ]
        return "\n".join(lines + [f"{n}=={v}" + (f" ; {m}" if m else "") for n, v, m in sorted(self.entries)]) + "\n"


def _range(minors: list[int]) -> str:
    return f"3.{minors[0]}-3.{minors[-1]}" if len(minors) > 1 else f"3.{minors[0]}"


def project_requirements() -> list[str]:
    return list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])


def requirements_hash(reqs: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(reqs)).encode()).hexdigest()[:16]


def read_pins() -> Pins | None:
    if not PINS.exists():
        return None
    entries, pythons, rhash = [], [], ""
    for line in PINS.read_text().splitlines():
        if line.startswith("# pythons:"):
            pythons = [int(v.split(".")[1]) for v in line.split(":", 1)[1].split()]
        elif line.startswith("# requirements-hash:"):
            rhash = line.split(":", 1)[1].strip()
        elif line.strip() and not line.startswith("#"):
            req, _, marker = line.partition(";")
            name, _, version = req.partition("==")
            entries.append((canonicalize_name(name), version.strip(), marker.strip()))
    return Pins(entries, pythons, rhash) if entries and pythons else None


# ------------------------------------------------------------------ wheels


def pip(*args: str, quiet: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check"]
    return subprocess.run(cmd + (["--quiet"] if quiet else []), capture_output=True, text=True)


def serves_later_versions(wheel: Path) -> bool:
    """A wheel fetched for the oldest CPython that every newer one can use as well: pure Python, or
    built for the stable ABI (pip would pick a newer, ABI-specific variant per version; no need)."""
    _, _, _, tags = parse_wheel_filename(wheel.name)
    return all((t.abi == "none" and t.platform == "any" and t.interpreter in ("py3", "py2")) or t.abi == "abi3"
               for t in tags)


class WheelCache:
    """Wheels per (target, interpreter) under the build cache; which files a pin set uses is remembered,
    so a rebuild with unchanged pins runs no pip at all."""

    def __init__(self, root: Path, target: Target):
        self.root, self.target = root / "wheels" / target.name, target

    def fetch(self, pins: dict[str, str], minor: int, shared: dict[str, Path], online: bool = True) -> dict[str, Path]:
        """Wheels of every pin for CPython 3.minor; `shared` are those fetched for the oldest that serve it too."""
        folder = self.root / f"cp3{minor}"
        wanted = {n: v for n, v in pins.items() if n not in shared}
        key = hashlib.sha256(json.dumps(sorted(wanted.items())).encode()).hexdigest()[:16]
        memo = folder / f"selected-{key}.json"
        if memo.exists():
            chosen = {n: folder / p for n, p in json.loads(memo.read_text()).items()}
            if all(p.exists() for p in chosen.values()):
                return {**shared, **chosen}
        folder.mkdir(parents=True, exist_ok=True)
        reqs = folder / f"requirements-{key}.txt"
        reqs.write_text("".join(f"{n}=={v}\n" for n, v in sorted(wanted.items())))
        args = ["download", "--no-deps", "--only-binary=:all:", "--implementation", "cp", "--python-version",
                f"3.{minor}", "--platform", self.target.pip_platform, "-d", str(folder), "-r", str(reqs)]
        proc = pip(*args, "--no-index", "--find-links", str(folder)) if any(folder.glob("*.whl")) else None
        if (proc is None or proc.returncode != 0) and online:
            proc = pip(*args)
        if proc is None or proc.returncode != 0:
            raise BuildError(f"no wheels for CPython 3.{minor} on {self.target.name}" +
                             (f":\n{_pip_error(proc)}" if proc else " in the wheel cache"))
        chosen = {}
        for name, version in wanted.items():
            matches = [p for p in folder.glob("*.whl") if _wheel_is(p, name, version)]
            if len(matches) != 1:
                raise BuildError(f"expected one wheel of {name}=={version} in {folder}, found {matches}")
            chosen[name] = matches[0]
        memo.write_text(json.dumps({n: p.name for n, p in sorted(chosen.items())}))
        return {**shared, **chosen}


def _wheel_is(path: Path, name: str, version: str) -> bool:
    wname, wversion, _, _ = parse_wheel_filename(path.name)
    return wname == name and wversion == Version(version)


def _pip_error(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in (proc.stderr + proc.stdout).splitlines() if "WARNING: Location" not in line]
    return "\n".join(lines[-8:])


def marker_env(target: Target, minor: int) -> dict[str, str]:
    return {
        "python_version": f"3.{minor}", "python_full_version": f"3.{minor}.0", "implementation_name": "cpython",
        "implementation_version": f"3.{minor}.0", "platform_python_implementation": "CPython", "os_name": "posix",
        "sys_platform": target.sys_platform, "platform_system": {"linux": "Linux", "darwin": "Darwin"}[target.sys_platform],
        "platform_machine": target.machines[0], "platform_release": "", "platform_version": "", "extra": "",
    }


def check_closure(reqs: list[str], wheels: dict[str, Path], env: dict[str, str]) -> list[str]:
    """What the pinned wheels fail to provide for one interpreter (markers and extras evaluated for it)."""
    requires = {}
    for name, path in wheels.items():
        with zipfile.ZipFile(path) as zf:
            meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            msg = email.parser.BytesParser().parsebytes(zf.read(meta), headersonly=True)
        requires[name] = (parse_wheel_filename(path.name)[1], msg.get_all("Requires-Dist") or [])
    problems, seen, todo = [], set(), [Requirement(r) for r in reqs]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name not in requires:
            problems.append(f"{req} is not pinned")
            continue
        version, deps = requires[name]
        if not req.specifier.contains(version, prereleases=True):
            problems.append(f"{req} is pinned at {version}")
        key = (name, frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        for line in deps:
            dep = Requirement(line)
            if dep.marker is None or any(dep.marker.evaluate({**env, "extra": e}) for e in ("", *req.extras)):
                todo.append(dep)
    return problems


def resolve(target: Target, reqs: list[str]) -> dict[str, str]:
    """pip's resolution of the requirements for the oldest CPython on one platform."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        proc = pip("install", "--dry-run", "--ignore-installed", "--report", str(report), "--only-binary=:all:",
                   "--implementation", "cp", "--python-version", f"3.{OLDEST}", "--platform", target.pip_platform,
                   "--target", str(Path(tmp) / "t"), *reqs)
        if proc.returncode != 0:
            raise BuildError(f"cannot resolve the dependencies for {target.name}:\n{_pip_error(proc)}")
        items = json.loads(report.read_text())["install"]
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in items}


def relock(host: Target, cache: WheelCache, reqs: list[str]) -> Pins:
    """Resolve the dependency closure for the oldest CPython on every platform (a platform that lacks
    wheels of a release gets its own version, under a marker), then find how far up CPython the
    wheels reach on this one."""
    log(f"resolving {', '.join(reqs)} for CPython 3.{OLDEST} on {', '.join(TARGETS)}")
    with ThreadPoolExecutor(max_workers=len(TARGETS)) as pool:
        resolved = dict(zip(TARGETS, pool.map(lambda t: resolve(TARGETS[t], reqs), TARGETS)))
    entries = []
    for name in sorted(set().union(*resolved.values())):
        by_version: dict[str | None, list[str]] = {}
        for target, versions in resolved.items():
            by_version.setdefault(versions.get(name), []).append(target)
        for version, targets in by_version.items():
            if version is None:
                continue
            marker = "" if len(targets) == len(TARGETS) else " or ".join(
                f'(sys_platform == "{TARGETS[t].sys_platform}" and platform_machine == "{TARGETS[t].machines[0]}")'
                for t in targets)
            entries.append((name, version, marker))
    pins = Pins(entries, [OLDEST], requirements_hash(reqs))
    versions = pins.for_target(host)
    shared = {n: p for n, p in cache.fetch(versions, OLDEST, {}).items() if serves_later_versions(p)}
    minor = OLDEST + 1
    while True:  # every newer CPython whose wheels exist for the same pins
        try:
            wheels = cache.fetch(versions, minor, shared)
        except BuildError:
            break
        if check_closure(reqs, wheels, marker_env(host, minor)):
            break
        pins.pythons.append(minor)
        minor += 1
    log(f"pinned {len(versions)} distributions for CPython {_range(pins.pythons)}")
    return pins


# ------------------------------------------------------------------ staging


@dataclass
class Stage:
    files: dict[str, bytes]  # path in the archive -> content (pure Python and data)
    natives: dict[str, dict[int | None, bytes]]  # extension module -> {minor (None: abi3): file}
    suffixes: dict[int, str]  # minor -> extension suffix of that interpreter on the target


def prune_reason(rel: str) -> str | None:
    if rel in PRUNE_KEEP:
        return None
    for prefix, why in PRUNE_PREFIXES.items():
        if rel.startswith(prefix):
            return why
    parts = rel.split("/")
    if any(p in PRUNE_DIRS for p in parts[:-1]) or rel.endswith(PRUNE_SUFFIXES):
        return "never imported at run time"
    if parts[0].endswith(".dist-info"):
        if parts[0].startswith("pycparser-"):
            return "pycparser is not shipped"
        if not DIST_INFO_KEEP.match("/".join(parts[1:])):
            return "installer bookkeeping"
    return None


def thin_macho(data: bytes, cpu: int, where: str) -> bytes:
    """The one architecture's slice of a universal (fat) Mach-O binary, as `lipo -thin` cuts it (each
    slice is a whole Mach-O file with its own code signature); other files unchanged."""
    magic = data[:4]
    if magic not in (b"\xca\xfe\xba\xbe", b"\xca\xfe\xba\xbf"):
        return data
    wide = magic == b"\xca\xfe\xba\xbf"
    count = struct.unpack(">I", data[4:8])[0]
    size = 32 if wide else 20
    for i in range(count):
        entry = data[8 + i * size: 8 + (i + 1) * size]
        cputype, _, offset, length = (struct.unpack(">iiQQ", entry[:24]) if wide else struct.unpack(">iiII", entry[:16]))
        if cputype == cpu:
            slice_ = data[offset: offset + length]
            if slice_[:4] != b"\xcf\xfa\xed\xfe" or struct.unpack("<i", slice_[4:8])[0] != cpu:
                raise BuildError(f"{where}: the universal binary's slice for CPU {cpu:#x} is not a 64-bit Mach-O file")
            return slice_
    raise BuildError(f"{where}: a universal binary without a slice for CPU {cpu:#x}")


def metadata_headers(data: bytes) -> bytes:
    """METADATA without its long description: importlib.metadata reads only the headers."""
    head, sep, _ = data.partition(b"\n\n")
    return head + b"\n" if sep else data


def stage(target: Target, per_version: dict[int, dict[str, Path]]) -> Stage:
    files: dict[str, bytes] = {}
    origin: dict[str, str] = {}
    natives: dict[str, dict[int | None, bytes]] = {}
    suffixes = {minor: f".cpython-3{minor}{target.suffix_tail}" for minor in per_version}
    for minor, wheels in sorted(per_version.items()):
        for path in sorted(wheels.values()):
            with zipfile.ZipFile(path) as zf:
                for info in zf.infolist():
                    rel = info.filename
                    if info.is_dir():
                        continue
                    data_dir = re.match(r"^[^/]+\.data/(purelib|platlib)/(.+)$", rel)
                    if data_dir:
                        rel = data_dir.group(2)
                    elif re.match(r"^[^/]+\.data/", rel):
                        continue
                    if prune_reason(rel):
                        continue
                    data = zf.read(info)
                    if NATIVE.search(rel):
                        ext = EXTENSION.match(rel)
                        if not ext:
                            raise BuildError(f"{path.name}: {rel} is native code that is not a Python extension "
                                             "module (shared libraries beside extensions are not supported)")
                        module = ext["module"].replace("/", ".")
                        if target.macho_cpu:
                            data = thin_macho(data, target.macho_cpu, f"{path.name}: {rel}")
                        if ext["minor"] is None:
                            natives.setdefault(module, {})[None] = data
                        elif "." + ext["tag"] != suffixes[minor]:
                            raise BuildError(f"{path.name}: {rel} is not for CPython 3.{minor} on {target.name} "
                                             f"(expected suffix {suffixes[minor]})")
                        else:
                            natives.setdefault(module, {})[minor] = data
                        continue
                    if rel.endswith(".dist-info/METADATA"):
                        data = metadata_headers(data)
                    if rel in files and files[rel] != data:
                        raise BuildError(f"{rel} differs between {origin[rel]} and {path.name}")
                    files[rel], origin[rel] = data, path.name
    for module, builds in natives.items():
        if None not in builds and set(builds) != set(per_version):
            raise BuildError(f"{module} is built for CPython {sorted(builds)} only, not all of {sorted(per_version)}")
    tops = {rel.split("/")[0].removesuffix(".py") for rel in files if "/" in rel or rel.endswith(".py")}
    if tops & sys.stdlib_module_names:  # the bundle's finder comes first: it would shadow the stdlib
        raise BuildError(f"bundled packages named like standard-library modules: {sorted(tops & sys.stdlib_module_names)}")
    for src in sorted((ROOT / "akm").rglob("*")):
        rel = src.relative_to(ROOT).as_posix()
        if src.is_file() and not prune_reason(rel):
            files[rel] = src.read_bytes()
    files.update(akm_dist_info())
    return Stage(files, natives, suffixes)


def akm_dist_info() -> dict[str, bytes]:
    """akm's own dist-info, as an install writes it (headers only): importlib.metadata.version("akm"),
    its requirements and its console script, from pyproject.toml and akm.__version__."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    match = re.search(r'^__version__ = "([^"]+)"', (ROOT / "akm" / "__init__.py").read_text(), re.M)
    if not match:
        raise BuildError("akm/__init__.py has no __version__ = \"...\" line")
    version = match.group(1)
    meta = ["Metadata-Version: 2.4", f"Name: {project['name']}", f"Version: {version}",
            f"Summary: {project.get('description', '')}", f"License-Expression: {project.get('license', '')}",
            f"Requires-Python: {project.get('requires-python', '')}"]
    meta += [f"Requires-Dist: {r}" for r in project.get("dependencies", [])]
    info = f"{project['name']}-{version}.dist-info"
    scripts = "".join(f"{k} = {v}\n" for k, v in sorted(project.get("scripts", {}).items()))
    return {f"{info}/METADATA": ("\n".join(meta) + "\n").encode(), f"{info}/top_level.txt": b"akm\n",
            f"{info}/entry_points.txt": f"[console_scripts]\n{scripts}".encode()}


# ------------------------------------------------------------------ native streams


def xz_filters(target: Target, largest: int) -> list[dict]:
    # The dictionary reaches back over a whole member, so a build for one CPython is coded as its
    # differences from the previous one.
    dict_size = max(8 << 20, 1 << (largest + (1 << 20)).bit_length())
    lzma2 = {"id": lzma.FILTER_LZMA2, "preset": 6 | lzma.PRESET_EXTREME, "dict_size": min(dict_size, 64 << 20)}
    return ([{"id": target.bcj}] if target.bcj else []) + [lzma2]


def pack_natives(target: Target, stage: Stage, cache: Path) -> tuple[dict[str, bytes], dict[str, tuple]]:
    """xz streams of the extension modules, each holding up to CHAIN interpreters' builds of one
    extension back to back; returns the streams and MEMBERS for _akm_unpack."""
    jobs = {}
    for module, builds in sorted(stage.natives.items()):
        order = [None] if None in builds else sorted(builds)
        for i in range(0, len(order), CHAIN):
            chunk = order[i: i + CHAIN]
            jobs[f"{module}.{i // CHAIN}.xz"] = (module, chunk, [builds[m] for m in chunk])
    members: dict[str, tuple] = {}

    def compress(name: str) -> bytes:
        _, _, blobs = jobs[name]
        filters = xz_filters(target, max(map(len, blobs)))
        key = hashlib.sha256(repr(filters).encode() + b"".join(hashlib.sha256(b).digest() for b in blobs))
        cached = cache / "streams" / f"{key.hexdigest()}.xz"
        if cached.exists():
            return cached.read_bytes()
        data = lzma.compress(b"".join(blobs), format=lzma.FORMAT_XZ, filters=filters)
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(cached)
        return data

    for name, (module, order, blobs) in jobs.items():
        offset = 0
        for minor, blob in zip(order, blobs):
            suffix = ".abi3.so" if minor is None else stage.suffixes[minor]
            rel = module.replace(".", "/") + suffix
            members[rel] = (name, offset, len(blob), hashlib.sha256(blob).hexdigest())
            offset += len(blob)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:  # lzma releases the GIL
        streams = dict(zip(jobs, pool.map(compress, jobs)))
    return streams, members


# ------------------------------------------------------------------ archive


def literal(value: object) -> str:
    """repr, but sets in sorted order (their repr follows string hashing, which varies per process)."""
    if isinstance(value, (set, frozenset)):
        return "frozenset({" + ", ".join(repr(v) for v in sorted(value)) + "})"
    return repr(value)


def render(template: Path, constants: dict[str, object]) -> bytes:
    """A runtime module with its build-constants block filled in."""
    text = template.read_text()
    start = text.index("# --- build constants")
    start = text.index("\n", start) + 1
    end = text.index("# --- end of build constants ---")
    block = "".join(f"{k} = {literal(v)}\n" for k, v in constants.items())
    return (text[:start] + block + text[end:]).encode()


def library_zip(files: dict[str, bytes], date_time: tuple) -> tuple[bytes, dict[str, tuple | None]]:
    """The packages as an inner zip, and an index of where each file's data starts in it (the runtime
    reads a file with one pread) plus every directory (namespace packages, resource listings)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for rel, data in sorted(files.items()):
            info = zipfile.ZipInfo(rel, date_time=date_time)
            info.compress_type, info.external_attr = zipfile.ZIP_DEFLATED, 0o100644 << 16
            zf.writestr(info, data, compresslevel=9)
        infos = zf.infolist()
    raw = buf.getvalue()
    index: dict[str, tuple | None] = {}
    for info in infos:
        name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26: info.header_offset + 30])
        start = info.header_offset + 30 + name_len + extra_len
        index[info.filename] = (start, info.compress_size, info.file_size, info.compress_type, info.CRC)
    for rel in files:
        for i, ch in enumerate(rel):
            if ch == "/":
                index[rel[: i + 1]] = None
    return raw, index


def write_archive(out: Path, target: Target, stage: Stage, streams: dict[str, bytes], members: dict[str, tuple],
                  epoch: int) -> str:
    """The zipapp: shebang, then a zip of a few entries: the library zip first (so its offset is known),
    its index, the native streams, our runtime. Fixed timestamps and modes: byte-reproducible."""
    date_time = time.gmtime(epoch)[:6]
    library, index = library_zip(stage.files, date_time)
    lib_name = "_akm_lib.zip"
    base = len(SHEBANG) + 30 + len(lib_name)  # the inner zip's data follows the first local header
    index = {rel: None if v is None else (base + v[0], *v[1:]) for rel, v in index.items()}
    build_id = hashlib.sha256(hashlib.sha256(library).digest())
    for name, data in sorted(streams.items()):
        build_id.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    for runtime in ("main.py", "boot.py", "unpack.py"):
        build_id.update((HERE / runtime).read_bytes())
    bid = build_id.hexdigest()[:16]
    minors = sorted(stage.suffixes)
    main = render(HERE / "main.py", {"BUILD": bid})
    boot = render(HERE / "boot.py", {
        "TARGET": target.name, "SYS_PLATFORM": target.sys_platform, "MACHINES": target.machines,
        "PYTHONS": tuple(f"3.{m}" for m in minors), "SUFFIXES": frozenset(stage.suffixes.values()),
        "NATIVE": {m: None in b for m, b in sorted(stage.natives.items())},
    })
    unpack = render(HERE / "unpack.py", {"MEMBERS": dict(sorted(members.items()))})

    def entry(name: str, compress: int) -> zipfile.ZipInfo:
        info = zipfile.ZipInfo(name, date_time=date_time)
        info.compress_type, info.external_attr = compress, 0o100644 << 16
        return info

    with open(out, "wb") as f:
        f.write(SHEBANG)
        with zipfile.ZipFile(f, "w") as zf:
            zf.writestr(entry(lib_name, zipfile.ZIP_STORED), library)
            zf.writestr(entry("_akm_index.bin", zipfile.ZIP_STORED), marshal.dumps(index, 4))
            zf.writestr(entry("__main__.py", zipfile.ZIP_STORED), main)  # stored: a warm start needs no zlib
            zf.writestr(entry("_akm_boot.py", zipfile.ZIP_DEFLATED), boot)
            zf.writestr(entry("_akm_unpack.py", zipfile.ZIP_DEFLATED), unpack)
            for name, data in sorted(streams.items()):
                zf.writestr(entry(f"_akm_natives/{name}", zipfile.ZIP_STORED), data)
    with open(out, "rb") as f:
        f.seek(base)
        if f.read(4) != b"PK\x03\x04":
            raise BuildError("the library zip is not where the index says it is")
    out.chmod(0o755)
    return bid


# ------------------------------------------------------------------ main


def host_target() -> str:
    machine = platform.machine().lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64" if sys.platform == "linux" else "arm64"}.get(machine, machine)
    name = f"{'macos' if sys.platform == 'darwin' else sys.platform}-{machine}"
    if name not in TARGETS:
        raise BuildError(f"no build for this machine ({name}); pick one with --platform: {', '.join(TARGETS)}")
    return name


def build(target: Target, output: Path, cache_root: Path, force_relock: bool) -> None:
    cache = WheelCache(cache_root, target)
    reqs = project_requirements()
    pins = read_pins()
    if force_relock or pins is None or pins.requirements_hash != requirements_hash(reqs):
        if not force_relock:
            log("bundle/pins.txt does not match pyproject.toml's dependencies: re-resolving")
        pins = relock(target, cache, reqs)
        PINS.write_text(pins.text())
    versions = pins.for_target(target)
    first = cache.fetch(versions, pins.pythons[0], {})
    shared = {n: p for n, p in first.items() if serves_later_versions(p)}
    with ThreadPoolExecutor(max_workers=4) as pool:
        rest = dict(zip(pins.pythons[1:], pool.map(lambda m: cache.fetch(versions, m, shared), pins.pythons[1:])))
    per_version = {pins.pythons[0]: first, **rest}
    for minor, wheels in per_version.items():
        problems = check_closure(reqs, wheels, marker_env(target, minor))
        if problems:
            raise BuildError(f"bundle/pins.txt misses dependencies for CPython 3.{minor} on {target.name} "
                             f"({'; '.join(problems)}); run ./build.sh --relock")
    staged = stage(target, per_version)
    streams, members = pack_natives(target, staged, cache_root)
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "1767225600"))
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".tmp")
    build_id = write_archive(partial, target, staged, streams, members, epoch)
    partial.replace(output)
    size = output.stat().st_size
    log(f"built {output.relative_to(ROOT) if output.is_relative_to(ROOT) else output} for {target.name}, CPython "
        f"{_range(pins.pythons)}: {size / 2**20:.1f} MiB, build {build_id[:16]}")
    if size > MAX_SIZE:
        raise BuildError(f"{output} is {size / 2**20:.1f} MiB, over the {MAX_SIZE / 2**20:.1f} MiB budget")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="build.sh", description="Build the akm zipapp.")
    ap.add_argument("--platform", choices=sorted(TARGETS), help="target platform (default: this machine's)")
    ap.add_argument("--relock", action="store_true", help="re-resolve bundle/pins.txt from pyproject.toml")
    ap.add_argument("--output", type=Path, help="default: dist/akm, or dist/akm-PLATFORM for another platform")
    ap.add_argument("--cache", type=Path, help="wheel and stream cache (default: $AKM_BUILD_CACHE or "
                    "~/.cache/akm-build)")
    args = ap.parse_args(argv)
    try:
        host = _maybe_host()
        name = args.platform or host
        if name is None:
            host_target()  # raises, naming this machine
        output = args.output or ROOT / "dist" / ("akm" if name == host else f"akm-{name}")
        cache = args.cache or Path(os.environ.get("AKM_BUILD_CACHE") or
                                   Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "akm-build")
        build(TARGETS[name], output.resolve(), cache, args.relock)
    except BuildError as exc:
        print(f"build.sh: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _maybe_host() -> str | None:
    try:
        return host_target()
    except BuildError:
        return None


if __name__ == "__main__":
    sys.exit(main())
