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

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "tests" / "zipapp_mcp_probe.py"


@lru_cache(maxsize=1)
def interpreters() -> dict[tuple[int, int], str]:
    """One interpreter per Python version found on this machine (PATH, /usr/bin, pyenv)."""
    candidates = [sys.executable, shutil.which("python3"), "/usr/bin/python3", "/usr/local/bin/python3",
                  *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/*/bin/python[23]"))),
                  *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/*/bin/python")))]
    found: dict[tuple[int, int], str] = {}
    for exe in dict.fromkeys(c for c in candidates if c and os.access(c, os.X_OK)):
        try:
            out = subprocess.run([exe, "-c", "import sys; print('%d %d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if len(out) == 2:
            found.setdefault((int(out[0]), int(out[1])), os.path.realpath(exe) if "shims" in exe else exe)
    return found


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
    boot, _, _ = bundle_facts(akm_bin)
    minors = {int(v.split(".")[1]) for v in boot["PYTHONS"]}
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
    assert "yaml/__init__.py" in index and "akm/cli.py" in index and "mcp/server/mcpserver/__init__.py" in index


MACHINE_CODE = {  # what each target's extension modules must be: ELF e_machine, or Mach-O CPU type
    "linux-x86_64": b"\x7fELF", "linux-aarch64": b"\x7fELF", "macos-x86_64": b"\xcf\xfa\xed\xfe",
    "macos-arm64": b"\xcf\xfa\xed\xfe"}
CPU = {"linux-x86_64": 62, "linux-aarch64": 183, "macos-x86_64": 0x01000007, "macos-arm64": 0x0100000C}


def _cpu(data: bytes) -> int:
    return struct.unpack("<H", data[18:20])[0] if data[:4] == b"\x7fELF" else struct.unpack("<i", data[4:8])[0]


def test_every_platform_carries_every_pythons_native_code(akm_bin, tmp_path):
    """`./build.sh --platform P` for the other platforms (from the wheel cache): each file has, for
    every supported CPython, every native extension built for that platform's machine, intact."""
    host = bundle_facts(akm_bin)[0]["TARGET"]
    others = sorted(set(MACHINE_CODE) - {host})

    def build(name: str) -> subprocess.CompletedProcess:
        return run([sys.executable, str(ROOT / "bundle" / "build.py"), "--platform", name, "--output",
                    str(tmp_path / f"akm-{name}")], dict(os.environ), ROOT, timeout=900)

    with ThreadPoolExecutor(max_workers=len(others)) as pool:
        builds = dict(zip(others, pool.map(build, others)))
    for name in [host, *others]:
        path = akm_bin if name == host else tmp_path / f"akm-{name}"
        if name != host:
            assert builds[name].returncode == 0, builds[name].stderr
        assert path.stat().st_size <= 12 * 2**20, (name, path.stat().st_size)
        boot, unpack, _index = bundle_facts(path)
        assert boot["TARGET"] == name
        minors = [int(v.split(".")[1]) for v in boot["PYTHONS"]]
        assert minors == list(range(11, minors[-1] + 1)) and minors[-1] >= 13, (name, minors)
        tail = {"linux-x86_64": "-x86_64-linux-gnu.so", "linux-aarch64": "-aarch64-linux-gnu.so"}.get(name, "-darwin.so")
        assert boot["SUFFIXES"] == {f".cpython-3{m}{tail}" for m in minors}
        assert {"pydantic_core._pydantic_core", "rpds.rpds", "cryptography.hazmat.bindings._rust",
                "_cffi_backend"} <= set(boot["NATIVE"])
        streams: dict[str, bytes] = {}
        with zipfile.ZipFile(path) as zf:
            for module, abi3 in boot["NATIVE"].items():
                base = module.replace(".", "/")
                for rel in [base + ".abi3.so"] if abi3 else [base + suffix for suffix in sorted(boot["SUFFIXES"])]:
                    assert rel in unpack["MEMBERS"], (name, rel)  # each (version, platform) pair is there
                    stream, offset, size, sha256 = unpack["MEMBERS"][rel]
                    if stream not in streams:
                        streams[stream] = lzma.decompress(zf.read("_akm_natives/" + stream))
                    data = streams[stream][offset: offset + size]
                    assert hashlib.sha256(data).hexdigest() == sha256, (name, rel)
                    assert data[:4] == MACHINE_CODE[name] and _cpu(data) == CPU[name], (name, rel)


def test_small_and_byte_reproducible(akm_bin, tmp_path):
    size = akm_bin.stat().st_size
    assert size <= 12 * 2**20, f"dist/akm is {size / 2**20:.1f} MiB"
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
        results = dict(zip(pythons, pool.map(drive, pythons)))
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
            assert proc.stderr == f"error[UNSUPPORTED_PYTHON]: akm needs Python 3.11+; this is {major}.{minor} at {exe}\n"


def test_akm_mcp_from_the_file_on_every_local_python(akm_bin, tmp_path, shared_cache):
    """`akm mcp` from the built file answers initialize, lints and runs a workflow over stdio, under
    each interpreter; the client is the bundle's own `mcp.Client` (so mcp.client imports too)."""
    pythons = supported(akm_bin)
    cache = shared_cache

    def probe(version: tuple[int, int]) -> subprocess.CompletedProcess:
        project = tmp_path / f"p{version[1]}"
        project.mkdir()
        shutil.copy(ROOT / "examples" / "hello.md", project / "hello.md")
        env = clean_env(tmp_path / f"e{version[1]}", SHIV_ROOT=str(cache), AKM_BUNDLE_EXEC=str(PROBE),
                        AKM_PROBE_ZIPAPP=str(akm_bin))
        return run([pythons[version], str(akm_bin), "hello.md"], env, project)

    with ThreadPoolExecutor(max_workers=len(pythons)) as pool:
        results = dict(zip(pythons, pool.map(probe, pythons)))
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
    assert (build_dir / "pyc" / tag / "_akm_boot.pyc").is_file() and (build_dir / "pyc" / tag / "akm" / "cli.pyc").is_file()
    second = run([sys.executable, "-S", "-X", "importtime", str(akm_bin), "--version"], env, tmp_path)  # -S: no .pth imports
    assert second.returncode == 0 and second.stdout == first.stdout
    imported = {line.rsplit("|", 1)[1].strip() for line in second.stderr.splitlines() if "|" in line}
    assert "akm.cli" in imported
    assert not imported & {"_akm_unpack", "zlib", "lzma", "zipfile", "importlib.metadata"}, imported


# A command that loads pydantic (native code) and akm/api.py: a run no longer does (plain-record plan and
# config), so the native-code paths are exercised through it.
NATIVE_CMD = ("config", "path")


def test_cache_falls_back_to_private_temp_dir_then_fails_clearly(akm_bin, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    (tmp_path / "w.md").write_text("---\nsteps:\n  - id: a\n    unit:\n      exec: { command: [\"true\"] }\n---\n\n## a\n\nx\n")
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
    assert sorted(p.relative_to(next(private.iterdir()) / "native").as_posix()
                  for p in private.rglob("*.so")) == [f"pydantic_core/_pydantic_core{suffix}"]

    env["TMPDIR"] = str(blocker / "tmp")  # nowhere writable
    version = run([sys.executable, str(akm_bin), "--version"], env, tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("akm ")  # needs no cache
    lint = run([sys.executable, str(akm_bin), "workflow", "lint", "w.md"], env, tmp_path)
    assert lint.returncode == 0 and "1 file checked: no errors" in lint.stdout, lint.stderr  # nor does lint
    started = run([sys.executable, str(akm_bin), *NATIVE_CMD], env, tmp_path)
    assert started.returncode == 78 and "Traceback" not in started.stderr
    assert started.stderr.startswith("error[NO_CACHE_DIR]: akm needs a writable directory to unpack its native code")
    assert str(blocker / "home") in started.stderr and "Set SHIV_ROOT" in started.stderr

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
    for argv in (["./akm"], [sys.executable, "./akm"], ["../bin/akm"], [str(tmp_path / "link")],
                 [sys.executable, str(home / "." / ".." / "bin" / "akm")]):
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
    (tmp_path / "w.md").write_text("---\nsteps:\n  - id: a\n    unit:\n      exec: { command: [\"true\"] }\n---\n\n## a\n\nx\n")
    _boot, unpack, index = bundle_facts(akm_bin)
    with zipfile.ZipFile(akm_bin) as zf:
        natives = {i.filename: i for i in zf.infolist() if i.filename.startswith("_akm_natives/")}
    offset, stored = index["akm/api.py"][:2]
    stream, _off, _size, _sha = unpack["MEMBERS"][f"pydantic_core/_pydantic_core{__import__('_imp').extension_suffixes()[0]}"]
    info = natives["_akm_natives/" + stream]
    stream_data = info.header_offset + 30 + len(info.filename) + 100 + info.compress_size // 2
    for name, at, what in (("source", offset + stored // 2, "akm/api.py "),  # then: does not match its checksum, or cannot be decompressed
                           ("native", stream_data, "native code for pydantic_core/_pydantic_core")):
        cache = tmp_path / f"cache-{name}"
        damaged = _damaged(akm_bin, tmp_path, name, at)
        # it loads akm/api.py and pydantic-core (lint would not: it imports no native code)
        proc = run([sys.executable, str(damaged), *NATIVE_CMD], clean_env(tmp_path, SHIV_ROOT=str(cache)),
                   tmp_path)
        assert proc.returncode == 78, proc.stderr
        assert proc.stderr.startswith(f"error[CORRUPT_BUNDLE]: {damaged} is damaged: {what}"), proc.stderr
        assert proc.stderr.rstrip().endswith("download or build it again")
        assert not list(cache.rglob("api.pyc" if name == "source" else "*.so"))  # nothing damaged is cached
    cut = tmp_path / "cut"
    cut.write_bytes(akm_bin.read_bytes()[: akm_bin.stat().st_size // 2])
    proc = run([sys.executable, str(cut), "--version"], clean_env(tmp_path), tmp_path)
    assert proc.returncode != 0
    assert "this file is cut short or damaged (it is a zip archive, and its end is missing): download or build it again" \
        in proc.stderr.splitlines()[1]


def test_a_cache_that_takes_no_new_file_falls_back_to_the_next_place(akm_bin, tmp_path):
    """The user cache exists (e.g. filled by another interpreter) but cannot take this interpreter's
    native code (read-only, another user's; here its native/ is a file): the private temp dir serves,
    as it would have without that cache; with nowhere else, the error names both."""
    (tmp_path / "w.md").write_text("---\nsteps:\n  - id: a\n    unit:\n      exec: { command: [\"true\"] }\n---\n\n## a\n\nx\n")
    tmp_dir = tmp_path / "tmp"
    tmp_dir.mkdir()
    env = clean_env(tmp_path, XDG_CACHE_HOME=str(tmp_path / "xdg"), TMPDIR=str(tmp_dir))
    assert run([sys.executable, str(akm_bin), "--version"], env, tmp_path).returncode == 0  # makes the cache
    [build_dir] = (tmp_path / "xdg" / "akm").iterdir()
    (build_dir / "native").write_text("")  # nothing can be unpacked there
    proc = run([sys.executable, str(akm_bin), *NATIVE_CMD], env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    suffix = __import__("_imp").extension_suffixes()[0]
    assert (tmp_dir / f"akm-{os.getuid()}" / build_dir.name / "native" / "pydantic_core" / f"_pydantic_core{suffix}").is_file()

    shutil.rmtree(tmp_dir / f"akm-{os.getuid()}")
    env["TMPDIR"] = str(tmp_path / "w.md")  # a file: no temp dir either
    proc = run([sys.executable, str(akm_bin), *NATIVE_CMD], env, tmp_path)
    assert proc.returncode == 78 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error[NO_CACHE_DIR]: akm needs a writable directory to unpack its native code")
    assert str(build_dir / "native") in proc.stderr and str(tmp_path / "w.md") in proc.stderr
