"""The built file: runs on every CPython >= 3.11 this machine has and refuses older ones with a clear
message; carries each supported interpreter's native code; runs what `akm mcp` needs; unpacks only
what it must, where it may; stays small and byte-reproducible. Uses the session's one build."""

from __future__ import annotations

import ast
import glob
import hashlib
import json
import lzma
import marshal
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import pytest

from tests.helpers import running_in_ci

# The build's size budget: bundle/build.py MAX_SIZE (12 MiB, and 0.5 more for tracing since issue 38)
MAX_SIZE = 12 * 2**20 + 512 * 2**10

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "tests" / "zipapp_mcp_probe.py"


def _pyenv_roots() -> list[str]:
    """Where pyenv keeps its Pythons: $PYENV_ROOT, what `pyenv root` says (any HOME), ~/.pyenv."""
    roots = [os.environ.get("PYENV_ROOT", "")]
    pyenv = shutil.which("pyenv")
    if pyenv:
        try:
            roots.append(subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=30).stdout.strip())
        except (OSError, subprocess.TimeoutExpired):
            pass
    roots.append(os.path.expanduser("~/.pyenv"))
    return [r for r in dict.fromkeys(roots) if r and os.path.isdir(os.path.join(r, "versions"))]


def listed_pythons() -> dict[tuple[int, int], str]:
    """The CPython versions this machine says it has (pyenv's versions directories), each with the
    directory it was listed from: the test must find an interpreter for every one of them."""
    listed: dict[tuple[int, int], str] = {}
    for root in _pyenv_roots():
        for entry in sorted(glob.glob(os.path.join(root, "versions", "*"))):
            m = re.match(r"^(\d+)\.(\d+)\.\d+$", os.path.basename(entry))  # CPython only: 3.12.1, not pypy3.10
            if m:
                listed.setdefault((int(m[1]), int(m[2])), entry)
    return listed


@lru_cache(maxsize=1)
def interpreters() -> dict[tuple[int, int], str]:
    """One interpreter per Python version found on this machine: PATH (python3, python3.X), /usr/bin,
    /usr/local/bin, pyenv (wherever its root is), and AKM_TEST_PYTHONS (paths, os.pathsep-separated)."""
    extra = [p for p in os.environ.get("AKM_TEST_PYTHONS", "").split(os.pathsep) if p]
    candidates = [
        *extra,
        sys.executable,
        shutil.which("python3"),
        *(shutil.which(f"python3.{m}") for m in range(6, 20)),
        *sorted(glob.glob("/usr/bin/python3*")),
        *sorted(glob.glob("/usr/local/bin/python3*")),
        *(
            exe
            for root in _pyenv_roots()
            for exe in sorted(glob.glob(os.path.join(root, "versions", "*", "bin", "python[23]")))
            + sorted(glob.glob(os.path.join(root, "versions", "*", "bin", "python")))
        ),
    ]
    found: dict[tuple[int, int], str] = {}
    for exe in dict.fromkeys(c for c in candidates if c and os.path.isfile(c) and os.access(c, os.X_OK)):
        try:
            out = subprocess.run(
                [
                    exe,
                    "-c",
                    "import platform, sys; print('%d %d %s' % (sys.version_info[0], "  # 2.7 too
                    "sys.version_info[1], platform.python_implementation().lower()))",
                ],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if len(out) == 3 and out[2] == "cpython":
            found.setdefault((int(out[0]), int(out[1])), os.path.realpath(exe) if "shims" in exe else exe)
    return found


def missing_pythons(minors: set[int]) -> list[str]:
    """Why the per-interpreter tests would test fewer Pythons than they should: a version pyenv lists
    that no interpreter was found for, or (in CI) fewer than two supported versions at all."""
    found = interpreters()
    problems = [
        f"3.{v[1]} is listed at {where} but no interpreter of it runs"
        for v, where in sorted(listed_pythons().items())
        if v[0] == 3 and v[1] in minors and v not in found
    ]
    if running_in_ci() and len([v for v in found if v[0] == 3 and v[1] in minors]) < 2:
        problems.append(f"CI must test at least two supported CPython versions; found {sorted(found)}")
    return problems


def test_a_python_that_cannot_be_found_fails_rather_than_is_skipped(tmp_path, monkeypatch):
    """The per-interpreter tests assert through missing_pythons(): a version pyenv lists whose
    interpreter does not run is named, and CI with fewer than two supported versions fails."""
    broken = tmp_path / "pyenv" / "versions" / "3.14.0" / "bin" / "python3"
    broken.parent.mkdir(parents=True)
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    monkeypatch.delenv("CI", raising=False)
    interpreters.cache_clear()
    try:
        assert f"3.14 is listed at {broken.parent.parent} but no interpreter of it runs" in missing_pythons({14})
        assert missing_pythons({99}) == []
        monkeypatch.setenv("CI", "1")
        assert any("at least two" in p for p in missing_pythons({99}))
    finally:
        interpreters.cache_clear()


def constants(zf: zipfile.ZipFile, member: str) -> dict:
    """The build-constants block of a runtime module inside the archive."""
    tree = ast.parse(zf.read(member))
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = eval(compile(ast.Expression(node.value), member, "eval"), {})  # literals
            except Exception:
                pass
    return out


def bundle_facts(akm_bin: Path) -> tuple[dict, dict, dict]:
    with zipfile.ZipFile(akm_bin) as zf:
        boot = constants(zf, "_akm_boot.py")
        unpack = constants(zf, "_akm_unpack.py")
        index = marshal.loads(zf.read("_akm_index.bin"))
        streams = {n.split("/", 1)[1] for n in zf.namelist() if n.startswith("_akm_natives/")}
    return boot, {**unpack, "streams": streams}, index


def supported(akm_bin: Path) -> dict[tuple[int, int], str]:
    """Every CPython this machine has that the file supports; fails rather than quietly test fewer."""
    boot, _, _ = bundle_facts(akm_bin)
    minors = {int(v.split(".")[1]) for v in boot["PYTHONS"]}
    problems = missing_pythons(minors)
    assert not problems, "; ".join(problems)
    return {v: exe for v, exe in interpreters().items() if v[0] == 3 and v[1] in minors}


def run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    """One cache for the per-interpreter tests: the CLI test fills it cold, the MCP test then compiles
    only what MCP adds (each stays correct run alone, only slower)."""
    return tmp_path_factory.mktemp("akm-cache")


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AKM_", "SHIV_"))}
    env.update(AKM_DATA_DIR=str(tmp_path / "data"), XDG_CONFIG_HOME=str(tmp_path / "config"), **extra)
    return env


# ------------------------------------------------------------------ what the file carries


def test_carries_native_code_for_every_supported_python(akm_bin):
    boot, unpack, index = bundle_facts(akm_bin)
    minors = [int(v.split(".")[1]) for v in boot["PYTHONS"]]
    assert minors == list(range(11, minors[-1] + 1)), "supported versions are 3.11 up, without gaps"
    local = {v[1] for v in interpreters() if v[0] == 3 and v[1] >= 11}
    assert local <= set(minors), f"this machine has CPython 3.{sorted(local)}, the file supports 3.{minors}"
    assert boot["SYS_PLATFORM"] == sys.platform and os.uname().machine in boot["MACHINES"]  # built for this machine
    assert boot["SUFFIXES"] == {f".cpython-3{m}-{_multiarch()}.so" for m in minors}
    members = unpack["MEMBERS"]
    assert "pydantic_core._pydantic_core" in boot["NATIVE"] and "rpds.rpds" in boot["NATIVE"]
    for module, abi3 in boot["NATIVE"].items():
        base = module.replace(".", "/")
        wanted = [base + ".abi3.so"] if abi3 else [base + suffix for suffix in boot["SUFFIXES"]]
        for rel in wanted:  # each (interpreter, platform) pair has its build, in a stream of the archive
            assert rel in members, f"{rel} missing"
            stream, _offset, size, sha256 = members[rel]
            assert stream in unpack["streams"] and size > 0 and len(sha256) == 64
    modules = [m.replace(".", "/") + "." for m in boot["NATIVE"]]
    assert all(any(rel.startswith(m) for m in modules) for rel in members)  # nothing else is native
    # never imported, so never shipped: libyaml bindings (pure-Python PyYAML serves), cffi's and
    # pycparser's binding generators, package test suites
    assert not [k for k in index if re.match(r"(yaml/_yaml|_yaml/|cffi/|pycparser/|[^/]+/tests/)", k)]
    assert (
        "yaml/__init__.py" in index and "akm/cli/__init__.py" in index and "mcp/server/mcpserver/__init__.py" in index
    )


MACHINE_CODE = {  # what each target's extension modules must be: ELF e_machine, or Mach-O CPU type
    "linux-x86_64": b"\x7fELF",
    "linux-aarch64": b"\x7fELF",
    "macos-x86_64": b"\xcf\xfa\xed\xfe",
    "macos-arm64": b"\xcf\xfa\xed\xfe",
}
CPU = {"linux-x86_64": 62, "linux-aarch64": 183, "macos-x86_64": 0x01000007, "macos-arm64": 0x0100000C}


def _cpu(data: bytes) -> int:
    return struct.unpack("<H", data[18:20])[0] if data[:4] == b"\x7fELF" else struct.unpack("<i", data[4:8])[0]


@pytest.mark.slow
def test_every_platform_carries_every_pythons_native_code(akm_bin, tmp_path):
    """`./build.sh --platform P` for the other platforms (from the wheel cache): each file has, for
    every supported CPython, every native extension built for that platform's machine, intact."""
    host = bundle_facts(akm_bin)[0]["TARGET"]
    others = sorted(set(MACHINE_CODE) - {host})

    def build(name: str) -> subprocess.CompletedProcess:
        return run(
            [
                sys.executable,
                str(ROOT / "bundle" / "build.py"),
                "--platform",
                name,
                "--output",
                str(tmp_path / f"akm-{name}"),
            ],
            dict(os.environ),
            ROOT,
            timeout=900,
        )

    with ThreadPoolExecutor(max_workers=len(others)) as pool:
        builds = dict(zip(others, pool.map(build, others), strict=False))
    for name in [host, *others]:
        path = akm_bin if name == host else tmp_path / f"akm-{name}"
        if name != host:
            assert builds[name].returncode == 0, builds[name].stderr
        assert path.stat().st_size <= MAX_SIZE, (name, path.stat().st_size)
        boot, unpack, _index = bundle_facts(path)
        assert boot["TARGET"] == name
        minors = [int(v.split(".")[1]) for v in boot["PYTHONS"]]
        assert minors == list(range(11, minors[-1] + 1)) and minors[-1] >= 13, (name, minors)
        tail = {"linux-x86_64": "-x86_64-linux-gnu.so", "linux-aarch64": "-aarch64-linux-gnu.so"}.get(
            name, "-darwin.so"
        )
        assert boot["SUFFIXES"] == {f".cpython-3{m}{tail}" for m in minors}
        assert {
            "pydantic_core._pydantic_core",
            "rpds.rpds",
            "cryptography.hazmat.bindings._rust",
            "_cffi_backend",
        } <= set(boot["NATIVE"])
        streams: dict[str, bytes] = {}
        with zipfile.ZipFile(path) as zf:
            for module, abi3 in boot["NATIVE"].items():
                base = module.replace(".", "/")
                for rel in [base + ".abi3.so"] if abi3 else [base + suffix for suffix in sorted(boot["SUFFIXES"])]:
                    assert rel in unpack["MEMBERS"], (name, rel)  # each (version, platform) pair is there
                    stream, offset, size, sha256 = unpack["MEMBERS"][rel]
                    if stream not in streams:
                        streams[stream] = lzma.decompress(zf.read("_akm_natives/" + stream))
                    data = streams[stream][offset : offset + size]
                    assert hashlib.sha256(data).hexdigest() == sha256, (name, rel)
                    assert data[:4] == MACHINE_CODE[name] and _cpu(data) == CPU[name], (name, rel)


def test_small_and_byte_reproducible(akm_bin, tmp_path):
    size = akm_bin.stat().st_size
    assert size <= MAX_SIZE, f"dist/akm is {size / 2**20:.1f} MiB"
    again = tmp_path / "akm-again"
    proc = run([sys.executable, str(ROOT / "bundle" / "build.py"), "--output", str(again)], dict(os.environ), ROOT)
    assert proc.returncode == 0, proc.stderr
    assert hashlib.sha256(again.read_bytes()).hexdigest() == hashlib.sha256(akm_bin.read_bytes()).hexdigest()


# ------------------------------------------------------------------ every interpreter


def test_cli_on_every_local_python(akm_bin, tmp_path, shared_cache):
    """--version, lint and an exec-only run under each CPython >= 3.11 here, sharing one cold cache:
    each unpacks its own build of the native extensions beside the others'."""
    pythons = supported(akm_bin)
    assert pythons, "no supported Python on this machine"
    cache = shared_cache

    def drive(version: tuple[int, int]) -> dict:
        exe = pythons[version]
        project = tmp_path / f"p{version[1]}"
        project.mkdir()
        shutil.copy(ROOT / "examples" / "hello.md", project / "hello.md")
        env = clean_env(tmp_path / f"e{version[1]}", SHIV_ROOT=str(cache))
        akm = [exe, str(akm_bin)]
        out = {"version": run([*akm, "--version"], env, project)}
        out["lint"] = run([*akm, "workflow", "lint", "hello.md", "--format", "json"], env, project)
        out["run"] = run([*akm, "workflow", "run", "hello.md", "--count", "2", "--format", "json"], env, project)
        out["native"] = run([*akm, *NATIVE_CMD], env, project)  # a run loads no native code; this does
        return out

    with ThreadPoolExecutor(max_workers=len(pythons)) as pool:
        results = dict(zip(pythons, pool.map(drive, pythons), strict=False))
    for version, out in results.items():
        for step, proc in out.items():
            assert proc.returncode == 0, f"3.{version[1]} {step}: {proc.stderr[-2000:]}"
        assert out["version"].stdout.startswith("akm ")
        assert json.loads(out["lint"].stdout)["ok"] is True
        run_view = json.loads(out["run"].stdout)["run"]
        steps = {s["id"]: s for s in run_view["steps"]}
        assert run_view["status"] == "completed"
        assert steps["greet"]["output"] == ["Hello, friend-1!", "Hello, friend-2!"]
    [build_dir] = cache.iterdir()
    unpacked = {p.name for p in (build_dir / "native" / "pydantic_core").iterdir()}
    assert unpacked >= {f"_pydantic_core.cpython-3{v[1]}-{_multiarch()}.so" for v in pythons}


def _multiarch() -> str:
    return re.search(r"cpython-\d+-(.+)\.so", __import__("_imp").extension_suffixes()[0]).group(1)


def test_refuses_older_python_clearly(akm_bin, tmp_path):
    old = {v: exe for v, exe in interpreters().items() if v < (3, 11)}
    if not old:
        pytest.skip("no Python older than 3.11 on this machine")
    (tmp_path / "w.md").write_text("---\nsteps: []\n---\n")
    for (major, minor), exe in sorted(old.items()):
        for args in (["--version"], ["workflow", "lint", "w.md"]):
            proc = run([exe, str(akm_bin), *args], clean_env(tmp_path), tmp_path, timeout=60)
            assert proc.returncode == 78, (exe, proc.stderr)
            assert proc.stdout == ""
            assert (
                proc.stderr == f"error[UNSUPPORTED_PYTHON]: akm needs Python 3.11+; this is {major}.{minor} at {exe}\n"
            )


def test_akm_mcp_from_the_file_on_every_local_python(akm_bin, tmp_path, shared_cache):
    """`akm mcp` from the built file answers initialize, lints and runs a workflow over stdio, under
    each interpreter; the client is the bundle's own `mcp.Client` (so mcp.client imports too)."""
    pythons = supported(akm_bin)
    cache = shared_cache

    def probe(version: tuple[int, int]) -> subprocess.CompletedProcess:
        project = tmp_path / f"p{version[1]}"
        project.mkdir()
        shutil.copy(ROOT / "examples" / "hello.md", project / "hello.md")
        env = clean_env(
            tmp_path / f"e{version[1]}", SHIV_ROOT=str(cache), AKM_BUNDLE_EXEC=str(PROBE), AKM_PROBE_ZIPAPP=str(akm_bin)
        )
        return run([pythons[version], str(akm_bin), "hello.md"], env, project)

    with ThreadPoolExecutor(max_workers=len(pythons)) as pool:
        results = dict(zip(pythons, pool.map(probe, pythons), strict=False))
    for version, proc in results.items():
        assert proc.returncode == 0, f"3.{version[1]}: {proc.stderr[-3000:]}"
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["server_name"] == "akm" and out["python"] == list(version)
        assert {"workflow_run", "workflow_lint", "workflow_next", "unit_report"} <= set(out["tools"])
        assert out["lint"]["is_error"] is False and out["lint"]["result"]["ok"] is True
        assert out["run"]["is_error"] is False and out["run"]["result"]["run"]["status"] == "completed"
        for module, origin in out["origins"].items():
            where = str(cache) if module.endswith(("_pydantic_core", "_rust")) else str(akm_bin)
            assert origin.startswith(where), (module, origin)
    [build_dir] = cache.iterdir()  # the servers loaded cryptography's extension (MCPServer seals state with it)
    assert (build_dir / "native" / "cryptography" / "hazmat" / "bindings" / "_rust.abi3.so").is_file()


# ------------------------------------------------------------------ the cache


def test_warm_start_reads_cached_bytecode_only(akm_bin, tmp_path):
    env = clean_env(tmp_path, SHIV_ROOT=str(tmp_path / "cache"))
    first = run([sys.executable, str(akm_bin), "--version"], env, tmp_path)
    assert first.returncode == 0 and first.stdout.startswith("akm ")
    [build_dir] = (tmp_path / "cache").iterdir()
    assert not (build_dir / "native").exists()  # --version needs no native code: nothing unpacked
    tag = sys.implementation.cache_tag
    assert (build_dir / "pyc" / tag / "_akm_boot.pyc").is_file() and (
        build_dir / "pyc" / tag / "akm" / "cli" / "__init__.pyc"
    ).is_file()
    second = run(
        [sys.executable, "-S", "-X", "importtime", str(akm_bin), "--version"], env, tmp_path
    )  # -S: no .pth imports
    assert second.returncode == 0 and second.stdout == first.stdout
    imported = {line.rsplit("|", 1)[1].strip() for line in second.stderr.splitlines() if "|" in line}
    assert "akm.cli" in imported
    assert not imported & {"_akm_unpack", "zlib", "lzma", "zipfile", "importlib.metadata"}, imported


# A command that loads pydantic (native code) and akm/api/__init__.py: a run no longer does (plain-record plan and
# config), so the native-code paths are exercised through it.
NATIVE_CMD = ("config", "path")


def test_cache_falls_back_to_private_temp_dir_then_fails_clearly(akm_bin, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    (tmp_path / "w.md").write_text(
        '---\nsteps:\n  - id: a\n    unit:\n      exec: { command: ["true"] }\n---\n\n## a\n\nx\n'
    )
    tmp_dir = tmp_path / "tmp"
    tmp_dir.mkdir()
    env = clean_env(tmp_path, HOME=str(blocker / "home"), TMPDIR=str(tmp_dir))  # HOME cannot exist
    env.pop("XDG_CACHE_HOME", None)
    lint = run([sys.executable, str(akm_bin), "workflow", "lint", "w.md"], env, tmp_path)
    assert lint.returncode == 0, lint.stderr
    private = tmp_dir / f"akm-{os.getuid()}"
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert not list(private.rglob("*.so"))  # lint is pure Python (no pydantic): nothing unpacked
    ok = run([sys.executable, str(akm_bin), "workflow", "run", "w.md"], env, tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert not list(private.rglob("*.so"))  # nor is a run (plain-record plan and config: no pydantic)
    ok = run([sys.executable, str(akm_bin), *NATIVE_CMD], env, tmp_path)
    assert ok.returncode == 0, ok.stderr
    # only what this interpreter imported is unpacked: its build of pydantic-core, no other Python's, and
    # nothing the command did not import (rpds under jsonschema stays packed; cryptography too)
    suffix = __import__("_imp").extension_suffixes()[0]
    assert sorted(p.relative_to(next(private.iterdir()) / "native").as_posix() for p in private.rglob("*.so")) == [
        f"pydantic_core/_pydantic_core{suffix}"
    ]

    env["TMPDIR"] = str(blocker / "tmp")  # nowhere writable
    version = run([sys.executable, str(akm_bin), "--version"], env, tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("akm ")  # needs no cache
    lint = run([sys.executable, str(akm_bin), "workflow", "lint", "w.md"], env, tmp_path)
    assert lint.returncode == 0 and "1 file checked: no errors" in lint.stdout, lint.stderr  # nor does lint
    started = run([sys.executable, str(akm_bin), *NATIVE_CMD], env, tmp_path)
    assert started.returncode == 78 and "Traceback" not in started.stderr
    assert started.stderr.startswith("error[NO_CACHE_DIR]: akm needs a writable directory to unpack its native code")
    assert str(blocker / "home") in started.stderr and "Set AKM_CACHE_DIR" in started.stderr

    shared = tmp_path / "shared"
    (shared / f"akm-{os.getuid()}").mkdir(parents=True)
    (shared / f"akm-{os.getuid()}").chmod(0o777)  # someone else could plant code there: never used
    env["TMPDIR"] = str(shared)
    started = run([sys.executable, str(akm_bin), *NATIVE_CMD], env, tmp_path)
    assert started.returncode == 78 and "not a private directory" in started.stderr, started.stderr
    assert not list(shared.rglob("*.so"))


# ------------------------------------------------------------------ how it is started, what it is


def test_runs_by_any_path_to_it(akm_bin, tmp_path):
    """`./akm`, `dir/../akm`, a symlink, a directory with spaces and non-ASCII: Python then knows the
    archive by a path that is not normalized (/w/./akm), which must not matter, cold cache or warm."""
    home = tmp_path / "dïr ü" / "bin"
    home.mkdir(parents=True)
    shutil.copy(akm_bin, home / "akm")
    (tmp_path / "link").symlink_to(home / "akm")
    shutil.copy(ROOT / "examples" / "hello.md", home / "hello.md")
    env = clean_env(tmp_path, SHIV_ROOT=str(tmp_path / "cache ü"))
    for argv in (
        ["./akm"],
        [sys.executable, "./akm"],
        ["../bin/akm"],
        [str(tmp_path / "link")],
        [sys.executable, str(home / "." / ".." / "bin" / "akm")],
    ):
        for args in (["--version"], ["workflow", "lint", "hello.md"]):
            shutil.rmtree(tmp_path / "cache ü", ignore_errors=True)
            for start in ("cold", "warm"):
                proc = run([*argv, *args], env, home)
                assert proc.returncode == 0 and "Traceback" not in proc.stderr, (argv, args, start, proc.stderr)
    proc = run(["./akm", "workflow", "run", "hello.md", "--format", "json"], env, home)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["run"]["status"] == "completed"


def _damaged(akm_bin: Path, tmp_path: Path, name: str, offset: int) -> Path:
    data = bytearray(akm_bin.read_bytes())
    data[offset] ^= 0xFF
    out = tmp_path / name
    out.write_bytes(data)
    out.chmod(0o755)
    return out


def test_a_damaged_file_says_so(akm_bin, tmp_path):
    """A bit flipped in bundled source or native code, or a file cut short, is named as damage to
    the file (never error[INTERNAL]), and nothing damaged is cached."""
    (tmp_path / "w.md").write_text(
        '---\nsteps:\n  - id: a\n    unit:\n      exec: { command: ["true"] }\n---\n\n## a\n\nx\n'
    )
    _boot, unpack, index = bundle_facts(akm_bin)
    with zipfile.ZipFile(akm_bin) as zf:
        natives = {i.filename: i for i in zf.infolist() if i.filename.startswith("_akm_natives/")}
    offset, stored = index["akm/api/__init__.py"][:2]
    stream, _off, _size, _sha = unpack["MEMBERS"][
        f"pydantic_core/_pydantic_core{__import__('_imp').extension_suffixes()[0]}"
    ]
    info = natives["_akm_natives/" + stream]
    stream_data = info.header_offset + 30 + len(info.filename) + 100 + info.compress_size // 2
    for name, at, what in (
        (
            "source",
            offset + stored // 2,
            "akm/api/__init__.py ",
        ),  # then: does not match its checksum, or cannot be decompressed
        ("native", stream_data, "native code for pydantic_core/_pydantic_core"),
    ):
        cache = tmp_path / f"cache-{name}"
        damaged = _damaged(akm_bin, tmp_path, name, at)
        # it loads akm/api/__init__.py and pydantic-core (lint would not: it imports no native code)
        proc = run([sys.executable, str(damaged), *NATIVE_CMD], clean_env(tmp_path, SHIV_ROOT=str(cache)), tmp_path)
        assert proc.returncode == 78, proc.stderr
        assert proc.stderr.startswith(f"error[CORRUPT_BUNDLE]: {damaged} is damaged: {what}"), proc.stderr
        assert proc.stderr.rstrip().endswith("download or build it again")
        assert not list(cache.rglob("api/__init__.pyc" if name == "source" else "*.so"))  # nothing damaged is cached
    cut = tmp_path / "cut"
    cut.write_bytes(akm_bin.read_bytes()[: akm_bin.stat().st_size // 2])
    proc = run([sys.executable, str(cut), "--version"], clean_env(tmp_path), tmp_path)
    assert proc.returncode != 0
    assert (
        "this file is cut short or damaged (it is a zip archive, and its end is missing): download or build it again"
        in proc.stderr.splitlines()[1]
    )


def test_a_cache_that_takes_no_new_file_falls_back_to_the_next_place(akm_bin, tmp_path):
    """The user cache exists (e.g. filled by another interpreter) but cannot take this interpreter's
    native code (read-only, another user's; here its native/ is a file): the private temp dir serves,
    as it would have without that cache; with nowhere else, the error names both."""
    (tmp_path / "w.md").write_text(
        '---\nsteps:\n  - id: a\n    unit:\n      exec: { command: ["true"] }\n---\n\n## a\n\nx\n'
    )
    tmp_dir = tmp_path / "tmp"
    tmp_dir.mkdir()
    env = clean_env(tmp_path, XDG_CACHE_HOME=str(tmp_path / "xdg"), TMPDIR=str(tmp_dir))
    assert run([sys.executable, str(akm_bin), "--version"], env, tmp_path).returncode == 0  # makes the cache
    [build_dir] = (tmp_path / "xdg" / "akm").iterdir()
    (build_dir / "native").write_text("")  # nothing can be unpacked there
    proc = run([sys.executable, str(akm_bin), *NATIVE_CMD], env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    suffix = __import__("_imp").extension_suffixes()[0]
    assert (
        tmp_dir / f"akm-{os.getuid()}" / build_dir.name / "native" / "pydantic_core" / f"_pydantic_core{suffix}"
    ).is_file()

    shutil.rmtree(tmp_dir / f"akm-{os.getuid()}")
    env["TMPDIR"] = str(tmp_path / "w.md")  # a file: no temp dir either
    proc = run([sys.executable, str(akm_bin), *NATIVE_CMD], env, tmp_path)
    assert proc.returncode == 78 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error[NO_CACHE_DIR]: akm needs a writable directory to unpack its native code")
    assert str(build_dir / "native") in proc.stderr and str(tmp_path / "w.md") in proc.stderr


# ------------------------------------------------------------------ like installed Python (every interpreter)


def on_every_python(akm_bin: Path, tmp_path: Path, script: str, **env: str) -> dict[tuple[int, int], dict]:
    """Run `script` inside the built file (AKM_BUNDLE_EXEC) under each supported CPython here, each with
    its own cache and temp dir; its last stdout line is JSON, returned per version."""
    pythons = supported(akm_bin)
    assert pythons, "no supported Python on this machine"
    (tmp_path / "script.py").write_text(script)

    def one(version: tuple[int, int]) -> subprocess.CompletedProcess:
        home = tmp_path / f"py3{version[1]}"
        (home / "tmp").mkdir(parents=True, exist_ok=True)
        run_env = clean_env(
            home,
            AKM_CACHE_DIR=str(home / "cache"),
            TMPDIR=str(home / "tmp"),
            AKM_BUNDLE_EXEC=str(tmp_path / "script.py"),
            **env,
        )
        return run([pythons[version], str(akm_bin)], run_env, home)

    with ThreadPoolExecutor(max_workers=len(pythons)) as pool:
        procs = dict(zip(pythons, pool.map(one, pythons), strict=False))
    out = {}
    for version, proc in procs.items():
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, f"3.{version[1]}: {proc.stderr[-3000:]}"
        out[version] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def with_build_id(src: Path, dst: Path, build_id: str) -> Path:
    """A copy of the file that is another build (its cache directory is akm-<build_id>): the same
    entries in the same order, so the library's offsets in the index still hold."""
    data = src.read_bytes()
    with zipfile.ZipFile(src) as zin, open(dst, "wb") as f:
        f.write(data[: zin.infolist()[0].header_offset])
        with zipfile.ZipFile(f, "w") as zout:
            for info in zin.infolist():
                body = zin.read(info)
                if info.filename == "__main__.py":
                    body, n = re.subn(rb"""BUILD = ['"][0-9a-f]{16}['"]""", b"BUILD = '%s'" % build_id.encode(), body)
                    assert n == 1, "no build constant in __main__.py"
                zout.writestr(info, body)
    dst.chmod(0o755)
    return dst


def _tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


HOLD = """\
import sys
print("ready", flush=True)
sys.stdin.read()  # a process of this build runs until its stdin closes
"""


def test_caches_of_other_builds_are_pruned_when_unused(akm_bin, tmp_path):
    """The first start of a build removes the cache directories of other builds beside its own (and
    what a killed pruner left), but not one a process of that build still uses: that one goes at a
    start after the process ended. Under each CPython here; the sizes are printed (pytest -s)."""
    pythons = supported(akm_bin)
    old = with_build_id(akm_bin, tmp_path / "akm-old", "0123456789abcdef")
    (tmp_path / "hold.py").write_text(HOLD)
    (tmp_path / "w.md").write_text(
        '---\nsteps:\n  - id: a\n    unit:\n      exec: { command: ["true"] }\n---\n\n## a\n\nx\n'
    )

    def scenario(version: tuple[int, int]) -> dict:
        exe, root = pythons[version], tmp_path / f"cache3{version[1]}"
        env = clean_env(tmp_path / f"e{version[1]}", AKM_CACHE_DIR=str(root))
        ran = run([exe, str(old), "workflow", "run", "w.md"], env, tmp_path)  # fills the old build's cache
        assert ran.returncode == 0, ran.stderr
        old_dir = root / "akm-0123456789abcdef"
        sizes = {"old build after a run": _tree_size(old_dir)}
        legacy = root / "akm-fedcba9876543210"  # from a runtime before pruning: no lock file
        (legacy / "native").mkdir(parents=True)
        (legacy / "native" / "x.so").write_bytes(b"\0" * 1000)
        (root / ".akm-0000000000000000.99.trash" / "pyc").mkdir(parents=True)
        (root / "notes").mkdir()  # not a cache directory: never touched
        holder = subprocess.Popen(
            [exe, str(old)],
            env=dict(env, AKM_BUNDLE_EXEC=str(tmp_path / "hold.py")),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout.readline() == "ready\n"
            first = run([exe, str(akm_bin), "workflow", "run", "w.md"], env, tmp_path)
            assert first.returncode == 0, first.stderr
            while_held = sorted(p.name for p in root.iterdir())
        finally:
            holder.communicate("", timeout=60)
        [new_name] = [n for n in while_held if n not in ("akm-0123456789abcdef", "notes")]
        assert (root / new_name / "prune-pending").exists()
        again = run([exe, str(akm_bin), "--version"], env, tmp_path)  # the old build's process has ended
        assert again.returncode == 0, again.stderr
        sizes["new build after a run"] = _tree_size(root / new_name)
        return {
            "while_held": while_held,
            "after": sorted(p.name for p in root.iterdir()),
            "new": new_name,
            "pending": (root / new_name / "prune-pending").exists(),
            "sizes": sizes,
        }

    with ThreadPoolExecutor(max_workers=len(pythons)) as pool:
        results = dict(zip(pythons, pool.map(scenario, pythons), strict=False))
    for version, r in sorted(results.items()):
        assert r["new"].startswith("akm-") and len(r["new"]) == 20, r
        assert r["while_held"] == sorted(["akm-0123456789abcdef", r["new"], "notes"]), (version, r)  # in use: kept
        assert r["after"] == sorted([r["new"], "notes"]) and not r["pending"], (version, r)
        print(f"3.{version[1]}: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in r["sizes"].items()))


MULTIPROCESSING = """\
import json, multiprocessing, os, sys
from concurrent.futures import ProcessPoolExecutor

import yaml


def probe(text):
    from pydantic_core import _pydantic_core
    return [os.getpid(), yaml.safe_load(text), _pydantic_core.__file__, yaml.__file__]


if __name__ == "__main__":
    out = {}
    for method in ("spawn", "forkserver", "fork"):
        ctx = multiprocessing.get_context(method)
        with ProcessPoolExecutor(1, mp_context=ctx) as pool:
            out[method] = pool.submit(probe, "a: [1, 2]").result(timeout=120)
        child = ctx.Process(target=yaml.safe_dump, args=({"b": 1},))  # a bundled function as the target
        child.start()
        child.join(120)
        out[method].append(child.exitcode)
    print(json.dumps({"pid": os.getpid(), "results": out, "archive": os.path.dirname(yaml.__path__[0])}))
"""


def test_multiprocessing_children_import_the_bundle(akm_bin, tmp_path):
    """spawn and forkserver children (forkserver is Linux's default from CPython 3.14) run the archive
    again, which installs the bundle before the parent's main script and target are loaded."""
    for version, out in on_every_python(akm_bin, tmp_path, MULTIPROCESSING).items():
        for method, (pid, loaded, native, yaml_file, exitcode) in out["results"].items():
            assert pid != out["pid"] and loaded == {"a": [1, 2]}, (version, method)
            assert native.startswith(str(tmp_path / f"py3{version[1]}" / "cache")), (version, method, native)
            assert yaml_file.startswith(out["archive"] + os.sep) and exitcode == 0, (version, method)


PKGUTIL = """\
import importlib.metadata, json, pkgutil
import akm, mcp.server, pydantic_core, yaml

print(json.dumps({
    "yaml": sorted(m.name for m in pkgutil.iter_modules(yaml.__path__)),
    "pydantic_core": sorted(m.name for m in pkgutil.iter_modules(pydantic_core.__path__)),
    "mcp": sorted(m.name for m in pkgutil.iter_modules(mcp.__path__, "mcp.")),  # walk_packages would import
    "mcp.server": sorted(m.name for m in pkgutil.iter_modules(mcp.server.__path__, "mcp.server.")),  # mcp.cli
    "top": sorted(m.name for m in pkgutil.iter_modules()),
    "data": len(pkgutil.get_data("certifi", "cacert.pem")),
    "akm": importlib.metadata.version("akm"), "akm_version": akm.__version__,
    "akm_requires": importlib.metadata.requires("akm"),
    "scripts": [e.value for e in importlib.metadata.entry_points(group="console_scripts", name="akm")],
}))
"""


def test_pkgutil_and_metadata_see_the_bundle(akm_bin, tmp_path):
    """pkgutil lists bundled modules as it would installed ones (its finder protocol on the archive's
    directories), and importlib.metadata knows akm itself."""
    _boot, _unpack, index = bundle_facts(akm_bin)

    def modules(package: str) -> list[str]:
        names = {k[len(package) + 1 : -3] for k in index if re.fullmatch(rf"{package}/\w+\.py", k)} - {"__init__"}
        names |= {k[len(package) + 1 : -12] for k in index if re.fullmatch(rf"{package}/\w+/__init__\.py", k)}
        assert names, package
        return sorted(names)

    for version, out in on_every_python(akm_bin, tmp_path, PKGUTIL).items():
        assert out["yaml"] == modules("yaml") and {"loader", "constructor", "cyaml"} <= set(out["yaml"]), version
        assert "_pydantic_core" in out["pydantic_core"]  # native: listed without being unpacked
        assert out["mcp"] == [f"mcp.{m}" for m in modules("mcp")] and "mcp.server" in out["mcp"], version
        assert out["mcp.server"] == [f"mcp.server.{m}" for m in modules("mcp/server")], version
        assert "mcp.server.stdio" in out["mcp.server"]
        assert {"akm", "yaml", "pydantic", "mcp", "certifi", "_cffi_backend", "pg8000", "scramp", "asn1crypto"} <= set(
            out["top"]
        ), version
        assert not any(n.startswith("_akm") for n in out["top"]), version
        assert out["data"] > 100_000
        assert out["akm"] == out["akm_version"] and any(r.startswith("mcp") for r in out["akm_requires"])
        assert out["scripts"] == ["akm.cli:run"]


CERTIFICATES = """\
import importlib.resources, json, os
import certifi
from akm.dispatch.llm import _ssl_context

where = certifi.where()
with importlib.resources.as_file(importlib.resources.files("jsonschema_specifications") / "schemas") as schemas:
    listed = sorted(os.listdir(schemas))
print(json.dumps({"where": where, "same": open(where, "rb").read() ==
                  importlib.resources.files("certifi").joinpath("cacert.pem").read_bytes(),
                  "ca_certs": len(_ssl_context().get_ca_certs()), "schemas": listed, "tmp": os.listdir(os.environ["TMPDIR"])}))
"""


def test_certificates_come_from_one_cached_file(akm_bin, tmp_path):
    """certifi.where() (what akm's https context loads) is one file in the build's cache, the same for
    every process, not a temporary copy per process; importlib.resources.as_file likewise."""
    env = {"SSL_CERT_FILE": "", "SSL_CERT_DIR": ""}  # httpx would read these instead of certifi
    first = on_every_python(akm_bin, tmp_path, CERTIFICATES, **env)
    for version, out in first.items():
        home = tmp_path / f"py3{version[1]}"
        assert out["where"].startswith(str(home / "cache")) and out["where"].endswith("/files/certifi/cacert.pem"), out
        assert out["same"] and out["ca_certs"] > 50 and out["tmp"] == [], (version, out)
        assert "draft202012" in out["schemas"], out  # a directory, copied whole
        assert not list((home / "tmp").iterdir())  # nothing left at exit either
    second = on_every_python(akm_bin, tmp_path, CERTIFICATES, **env)  # another process reuses the file
    assert {v: out["where"] for v, out in second.items()} == {v: out["where"] for v, out in first.items()}


SOURCES = """\
import inspect, json, os, traceback
import yaml

try:
    yaml.safe_load("a: [1")
except yaml.YAMLError:
    tb = traceback.format_exc()
print(json.dumps({"tb": tb, "file": yaml.__file__, "exists": os.path.exists(yaml.__file__),
                  "source": inspect.getsource(yaml.safe_load)}))
"""


def test_tracebacks_show_bundled_source_and_file_is_inside_the_archive(akm_bin, tmp_path):
    """What spec/build.md says of code run from the archive: tracebacks and inspect show the real
    source lines; a module's __file__ names a path inside the archive, which does not exist on disk."""
    for version, out in on_every_python(akm_bin, tmp_path, SOURCES).items():
        assert f'{out["file"][: -len("__init__.py")]}parser.py", line' in out["tb"], (version, out["tb"])
        assert "raise ParserError(" in out["tb"], out["tb"]  # the line itself, read from the archive
        assert out["exists"] is False and out["source"].startswith("def safe_load(")


def test_cache_dir_variable_and_its_old_name(akm_bin, tmp_path):
    """AKM_CACHE_DIR names the cache root; SHIV_ROOT, its old name, still works; the first wins."""
    base = clean_env(tmp_path)
    for extra, where in (
        ({"AKM_CACHE_DIR": str(tmp_path / "a")}, "a"),
        ({"SHIV_ROOT": str(tmp_path / "s")}, "s"),
        ({"AKM_CACHE_DIR": str(tmp_path / "b"), "SHIV_ROOT": str(tmp_path / "t")}, "b"),
    ):
        proc = run([sys.executable, str(akm_bin), "--version"], {**base, **extra}, tmp_path)
        assert proc.returncode == 0, proc.stderr
        [build_dir] = (tmp_path / where).iterdir()
        assert (build_dir / "pyc").is_dir() and (build_dir / "lock").is_file()
    assert not (tmp_path / "t").exists()
