# The installed package stands alone: its extension needs no library outside the package but the
# system's base libraries (the C/C++ runtime, OpenMP, the CUDA driver), so a wheel built on one
# machine imports on another that lacks Highway. Highway is bundled next to the extension and
# found through an $ORIGIN RUNPATH (python/CMakeLists.txt). Run by scripts/test_python.sh and
# `scripts/gpu.sh python`; `scripts/gpu.sh wheel` checks a wheel on a machine without Highway.
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import renaissance
import renaissance._core

EXTENSION = Path(renaissance._core.__file__).resolve()
PACKAGE = EXTENSION.parent

# The only libraries the extension may resolve outside its own package, by name up to ".so":
# glibc's (libc, libm, libpthread, libdl, librt, the dynamic loader and the kernel's vDSO), the
# C++ runtime, OpenMP and the CUDA driver (libcuda, loaded by the static CUDA runtime).
BASE_LIBRARIES = {"libc", "libm", "libpthread", "libdl", "librt", "libstdc++", "libgcc_s", "libgomp",
                  "libcuda", "linux-vdso", "linux-gate"}
BASE_PREFIXES = ("ld-linux",)  # ld-linux-x86-64.so.2, ld-linux-aarch64.so.1


def is_base(name):
    stem = name.split(".so")[0]
    return stem in BASE_LIBRARIES or stem.startswith(BASE_PREFIXES)


def clean_env():
    # The package must resolve its libraries by itself: nothing inherited may point the loader at
    # them (the GPU machine's scripts export LD_LIBRARY_PATH for the C++ build's programs).
    env = dict(os.environ)
    for var in ("LD_LIBRARY_PATH", "LD_PRELOAD", "LD_DEBUG", "LD_AUDIT"):
        env.pop(var, None)
    return env


def tool(name):
    path = shutil.which(name)
    assert path, f"{name} is needed to check the extension's libraries and is not on PATH"
    return path


def ldd(path):
    """(name, resolved path or None) for every library the loader resolves for `path`."""
    out = subprocess.run([tool("ldd"), str(path)], env=clean_env(), capture_output=True, text=True, check=True)
    libs = []
    for line in out.stdout.splitlines():
        line = line.strip()
        m = re.match(r"^(\S+) => (not found|(\S+) \(0x[0-9a-f]+\))$", line)
        if m:
            libs.append((m.group(1), m.group(3)))  # group 3 is None for "not found"
            continue
        m = re.match(r"^(\S+) \(0x[0-9a-f]+\)$", line)  # the loader and the vDSO: no "=>"
        if m:
            libs.append((os.path.basename(m.group(1)), m.group(1)))
            continue
        if line:
            raise AssertionError(f"unexpected ldd line for {path}: {line!r}")
    return libs


def dynamic_section(path):
    """(DT_NEEDED names, DT_RUNPATH and DT_RPATH entries) of an ELF file, by readelf -d."""
    out = subprocess.run([tool("readelf"), "-d", str(path)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    paths = []
    for entry in re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[([^\]]*)\]", out):
        paths += entry.split(":")
    return needed, paths


def test_every_library_resolves_inside_the_package_or_is_a_base_library():
    libs = ldd(EXTENSION)
    names = {name.split(".so")[0] for name, _ in libs}
    assert "libc" in names, f"ldd of {EXTENSION} lists no libc: {libs}"  # the parse itself works
    missing = [name for name, where in libs if where is None]
    assert not missing, f"{EXTENSION} needs libraries the loader does not find: {missing}"
    outside = [f"{name} => {where}" for name, where in libs
               if not is_base(name) and PACKAGE not in Path(where).resolve().parents]
    assert not outside, (f"{EXTENSION} resolves libraries outside its package {PACKAGE} that are not base "
                         f"libraries: {outside}")


def test_the_extension_searches_only_its_own_directory():
    needed, search = dynamic_section(EXTENSION)
    # An absolute entry (a build machine's dependency folder) would work there and nowhere else.
    assert set(search) <= {"$ORIGIN"}, f"{EXTENSION} RUNPATH/RPATH {search}: only $ORIGIN belongs there"
    bundled = [name for name in needed if not is_base(name)]
    for name in bundled:
        assert (PACKAGE / name).is_file(), f"{EXTENSION} needs {name}, which is not in {PACKAGE}"
    if bundled:
        assert search == ["$ORIGIN"], f"{EXTENSION} needs {bundled} from its package but searches {search}"


def test_a_moved_copy_of_the_package_loads_its_libraries_from_itself(tmp_path):
    # A copy elsewhere, imported with no LD_LIBRARY_PATH: each library the extension needs beyond
    # the base ones must be mapped from the copy (/proc/self/maps of the importing process), not
    # from the installed package nor from the system (where Debian's libhwy also lies here).
    copy = tmp_path / "site" / "renaissance"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    needed, _ = dynamic_section(EXTENSION)
    bundled = sorted(name for name in needed if not is_base(name))
    script = ("import sys, renaissance\n"
              "t = renaissance.Task([('w', (3,), 'fc_weight')], backend='cpu', threads=1)\n"
              "t.optimizer('sgd', lr=0.5).compile()\n"
              "print('package', renaissance.__file__)\n"
              "for line in open('/proc/self/maps'):\n"
              "    fields = line.split()\n"
              "    if len(fields) >= 6: print('mapped', fields[5])\n")
    env = clean_env()
    env["PYTHONPATH"] = str(copy.parent)
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, f"the moved copy does not import:\n{out.stderr}"
    lines = out.stdout.splitlines()
    assert lines[0] == f"package {copy / '__init__.py'}", lines[0]
    mapped = {line[len("mapped "):] for line in lines[1:]}
    for name in bundled:
        # The maps name the file opened after symlinks: libhwy.so.1.0.3 for a system libhwy.so.1.
        where = sorted({Path(m).resolve() for m in mapped if re.fullmatch(re.escape(name) + r"(\.[0-9]+)*",
                                                                            os.path.basename(m))})
        assert where == [(copy / name).resolve()], f"{name} mapped from {where}, expected the copy {copy / name}"
