#!/usr/bin/env python3
"""test_cuda_build.py - the CUDA build, compiled on a machine without a GPU
(CI): `make CUDA=1` on a copy of the tree; every kernel compiled to SASS for
sm_90a (and sm_80) with no register spills and no stack frame (ptxas -v, the
.ptxas logs beside the objects); the binary's fatbin holds an sm_90a ELF
(read from its .nv_fatbin section); and the binary, on a machine without a
device, refuses --gpu with one clear line while the CPU path still runs.
Skips, saying why, when nvcc is absent. Prints PASS/FAIL/SKIP lines."""
import glob
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from report import exit_status, report  # noqa: E402


def nvcc():
    for c in [shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]:
        if c and os.path.exists(c):
            return c
    return None


def fatbin_entries(path):
    """(kind, sm, arch_specific) of every entry of the ELF's .nv_fatbin section(s): kind 1 PTX, 2 ELF."""
    b = open(path, "rb").read()
    if b[:4] != b"\x7fELF" or b[4] != 2:
        return []
    shoff, = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize) for i in range(shnum)]
    stroff = secs[shstrndx][4]
    out = []
    for s in secs:
        name = b[stroff + s[0]:b.index(b"\0", stroff + s[0])].decode()
        if name != ".nv_fatbin":
            continue
        off, end = s[4], s[4] + s[5]
        while off + 16 <= end:
            magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", b, off)
            if magic != 0xBA55ED50:
                off += 8  # containers are 8-aligned
                continue
            e, eend = off + hsize, off + hsize + fsize
            while e + 0x30 <= eend:
                kind, _u, ehsize, psize = struct.unpack_from("<HHIQ", b, e)
                sm, = struct.unpack_from("<I", b, e + 0x1C)
                flags, = struct.unpack_from("<I", b, e + 0x28)
                out.append((kind, sm, bool((flags >> 16) & 0x10)))
                if ehsize == 0:
                    break
                e += ehsize + psize
            off = eend
    return out


def main():
    nv = nvcc()
    if not nv:
        print("SKIP cuda_build: nvcc not found (the CUDA toolkit is not installed here)")
        return 0
    with tempfile.TemporaryDirectory() as t:
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                               text=True).stdout.split()
        for f in files:
            src = os.path.join(ROOT, f)
            if os.path.isfile(src) and not f.startswith(("models/", "data/")):
                os.makedirs(os.path.dirname(os.path.join(t, f)), exist_ok=True)
                shutil.copy2(src, os.path.join(t, f))
        p = subprocess.run(["make", "-j2", "CUDA=1", f"NVCC={nv}", "build/specdec", "build/tests/gpu/test_gpu"], cwd=t,
                           capture_output=True, text=True)
        report("cuda_build_compiles", p.returncode == 0, (p.stdout + p.stderr)[-3000:])
        if p.returncode != 0:
            return exit_status()
        logs = "".join(open(f).read() for f in glob.glob(os.path.join(t, "build", "src", "runtime", "cuda", "*.ptxas")))
        entries = re.findall(r"Compiling entry function '([^']+)' for '(sm_\w+)'", logs)
        kernels = {k for k, _ in entries}
        archs = {(k, a) for k, a in entries}
        missing = [k for k in kernels for a in ("sm_90a", "sm_80") if (k, a) not in archs]
        # every __global__ of the sources compiled (selftest-only ones too)
        declared = sum(open(f).read().count("__global__") for f in glob.glob(os.path.join(t, "src", "runtime", "cuda", "*.cu")))
        report("cuda_sass_sm90a_and_sm80", len(kernels) >= declared and not missing,
               f"{len(kernels)} kernels of {declared} declared; without SASS: {missing[:5]}")
        spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", logs)
        stacks = re.findall(r"(\d+) bytes stack frame", logs)
        report("cuda_no_spills", spills and all(a == "0" and b == "0" for a, b in spills),
               f"spill lines: {[s for s in spills if s != ('0', '0')][:5]} of {len(spills)}")
        report("cuda_no_stack_frames", stacks and all(s == "0" for s in stacks), f"stack frames: {set(stacks)}")
        fat = fatbin_entries(os.path.join(t, "build", "specdec"))
        report("cuda_fatbin_has_sm90a_elf", (2, 90, True) in fat and (2, 80, False) in fat,
               f"fatbin entries (kind, sm, arch-specific): {sorted(set(fat))}")
        bin_ = os.path.join(t, "build", "specdec")
        model = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
        have_dev = subprocess.run(["sh", "-c", "command -v nvidia-smi && nvidia-smi -L"], capture_output=True).returncode == 0
        if have_dev:
            print("SKIP cuda_no_device_message: this machine has a GPU (scripts/gpu-check.sh checks it)")
        elif not os.path.exists(model):
            print("SKIP cuda_no_device_message: the default model is absent (scripts/fetch-models.sh)")
        else:
            r = subprocess.run([bin_, "generate", "-m", model, "-p", "hi", "-n", "4", "--gpu"], capture_output=True,
                               text=True, timeout=120)
            err = r.stderr.strip().splitlines()
            report("cuda_no_device_message", r.returncode == 1 and r.stdout == "" and len(err) == 1
                   and "--gpu" in err[0] and ("device" in err[0] or "CUDA" in err[0]), f"rc {r.returncode}: {r.stderr!r}")
            r = subprocess.run([bin_, "generate", "-m", model, "-p", "hi", "-n", "4"], capture_output=True, text=True,
                               timeout=120)
            report("cuda_build_runs_on_cpu", r.returncode == 0 and len(r.stdout) > 0, r.stderr[-500:])
    return exit_status()


if __name__ == "__main__":
    sys.exit(main())
