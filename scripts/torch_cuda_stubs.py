#!/usr/bin/env python3
"""Build do-nothing stand-ins for the CUDA libraries that a CUDA build of torch links against.

The PyPI torch wheel for Linux x86_64 is a CUDA build: `import torch` fails with e.g.
`libcudnn.so.9: cannot open shared object file` unless the nvidia-* wheels (several GB) are
installed. The fixture scripts only run torch on the CPU, so no CUDA function is ever called;
it is enough that the dynamic loader finds libraries with the right sonames, symbol versions and
symbol names. This script writes such stub libraries (every function returns 1, i.e. an error
code) into a folder:

    python3 scripts/torch_cuda_stubs.py /tmp/cudastubs
    export LD_LIBRARY_PATH=/tmp/cudastubs
    python3 -c 'import torch; print(torch.__version__)'

Needs gcc, nm and readelf (binutils). Never use this environment for GPU work.
Only the libraries that `ldd` reports as "not found" are stubbed.
"""
import importlib.util
import os
import re
import subprocess
import sys

# Unversioned undefined symbols are attributed to a missing library by prefix.
UNVERSIONED_PREFIXES = {
    "libcufile.so": ("cuFile",),
    "libcusparseLt.so": ("cusparseLt",),
    "libnccl.so": ("nccl",),
    "libnvshmem_host.so": ("nvshmem",),
    "libcudnn.so": ("cudnn",),
    "libcupti.so": ("cupti",),
}


def torch_lib_dir():
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("torch is not installed")
    return os.path.join(list(spec.submodule_search_locations)[0], "lib")


def run(cmd, extra_env=None):
    env = dict(os.environ)
    if extra_env:
        env.update(extra_env)
    return subprocess.run(cmd, capture_output=True, text=True, env=env).stdout


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = os.path.abspath(sys.argv[1])
    os.makedirs(out, exist_ok=True)
    libdir = torch_lib_dir()
    sos = sorted(os.path.join(libdir, f) for f in os.listdir(libdir) if ".so" in f)

    missing = set()
    for so in sos:
        for line in run(["ldd", so], {"LD_LIBRARY_PATH": ""}).splitlines():
            m = re.match(r"\s*(\S+) => not found", line)
            # libcuda.so.1 is the driver: cudart dlopens it and copes with its absence
            if m and not m.group(1).startswith("libcuda.so"):
                missing.add(m.group(1))
    if not missing:
        print("nothing missing: torch's libraries all resolve; no stubs needed")
        return

    # version name -> library file, from the verneed sections
    ver2lib = {}
    undefined = set()
    for so in sos:
        cur = None
        for line in run(["readelf", "-V", so]).splitlines():
            m = re.search(r"File: (\S+)\s+Cnt:", line)
            if m:
                cur = m.group(1)
                continue
            m = re.search(r"Name: (\S+)\s+Flags:", line)
            if m and cur in missing:
                ver2lib[m.group(1)] = cur
        for line in run(["nm", "-D", "--undefined-only", so]).splitlines():
            parts = line.split()
            if parts:
                undefined.add(parts[-1])

    for lib in sorted(missing):
        versions = sorted(v for v, l in ver2lib.items() if l == lib)
        syms = set()
        for s in undefined:
            name, _, ver = s.partition("@")
            ver = ver.lstrip("@")
            if ver and ver in versions:
                syms.add(name)
            elif not ver:
                for key, prefixes in UNVERSIONED_PREFIXES.items():
                    if lib.startswith(key) and name.startswith(prefixes):
                        syms.add(name)
        base = os.path.join(out, lib)
        with open(base + ".c", "w") as f:
            for s in sorted(syms):
                f.write(f"int {s}(void) {{ return 1; }}\n")
        cmd = ["gcc", "-shared", "-fPIC", "-o", base, base + ".c", "-Wl,-soname," + lib]
        if versions:
            with open(base + ".map", "w") as f:
                for v in versions:
                    f.write(f"{v} {{ global: *; }};\n")
            cmd.append("-Wl,--version-script=" + base + ".map")
        subprocess.check_call(cmd)
        print(f"stub {lib}: {len(syms)} symbols, versions {versions}")
    print(f"export LD_LIBRARY_PATH={out}")


if __name__ == "__main__":
    main()
