#!/usr/bin/env python3
"""The vulkan backend's SPIR-V reader (backends/vulkan/vk_spirv.c) against
spirv-dis (SPIRV-Tools, an independent disassembler): for every module the
vulkan plugin embeds, the number of specialization constants (highest SpecId
+ 1) and the bytes of the push-constant block (highest member offset + size),
read from the disassembly, must equal what `test_vulkan_spirv --dump` prints.
Modules this spirv-dis cannot disassemble (Debian 12's SPIRV-Tools predates
the KHR cooperative-matrix opcodes) are skipped and counted. Exit 77 (skipped)
without spirv-dis or without the plugin.

usage: spirv_oracle.py TEST_VULKAN_SPIRV"""
import re
import shutil
import subprocess
import sys
import tempfile


def oracle(path):
    r = subprocess.run(["spirv-dis", "--raw-id", path], capture_output=True, text=True)
    if r.returncode != 0 or "OpFunction" not in r.stdout:
        return None
    t = r.stdout
    spec = [int(x) for x in re.findall(r"OpDecorate %\d+ SpecId (\d+)", t)]
    n_spec = max(spec) + 1 if spec else 0
    types = {}
    for line in t.splitlines():
        m = re.match(r"\s*%(\d+) = (Op\w+)(.*)", line)
        if m:
            types[m.group(1)] = (m.group(2), m.group(3).split())
    var = re.search(r"%\d+ = OpVariable %(\d+) PushConstant", t)
    if not var:
        return n_spec, 0
    block = types[var.group(1)][1][1].lstrip("%")
    strides = dict(re.findall(r"OpDecorate %(\d+) ArrayStride (\d+)", t))
    consts = dict(re.findall(r"%(\d+) = OpConstant %\d+ (\d+)", t))

    def offsets(st):
        return {int(a): int(b) for a, b in re.findall(r"OpMemberDecorate %" + st + r" (\d+) Offset (\d+)", t)}

    def size(i):
        op, a = types[i]
        if op in ("OpTypeInt", "OpTypeFloat"):
            return int(a[0]) // 8
        if op in ("OpTypeVector", "OpTypeMatrix"):
            return size(a[0].lstrip("%")) * int(a[1])
        if op == "OpTypeArray":
            n = int(consts[a[1].lstrip("%")])
            return (int(strides[i]) if i in strides else size(a[0].lstrip("%"))) * n
        if op == "OpTypeStruct":
            off = offsets(i)
            return max(off[k] + size(m.lstrip("%")) for k, m in enumerate(a))
        if op == "OpTypePointer" and a[0] == "PhysicalStorageBuffer":
            return 8
        raise ValueError(f"type {op} {a}")

    return n_spec, size(block)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    if not shutil.which("spirv-dis"):
        print("spirv_oracle: spirv-dis not found (Debian: spirv-tools); skipped")
        return 77
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.argv[1], "--dump", d], capture_output=True, text=True)
        if r.returncode == 77:
            print(r.stdout.strip())
            return 77
        if r.returncode != 0:
            print(r.stdout, r.stderr)
            return 1
        bad, compared, skipped = 0, 0, []
        for line in r.stdout.split("\n"):
            if not line:
                continue
            name, n_spec, push = line.split()
            want = oracle(f"{d}/{name}.spv")
            if want is None:
                skipped.append(name)
                continue
            compared += 1
            if want != (int(n_spec), int(push)):
                print(f"{name}: vk_spirv reads {n_spec} constants, {push} push bytes; "
                      f"spirv-dis: {want[0]}, {want[1]}")
                bad += 1
    print(f"spirv_oracle: {compared} modules agree with spirv-dis"
          f"{', ' + str(bad) + ' differ' if bad else ''}; "
          f"{len(skipped)} not disassembled ({' '.join(skipped)})")
    return 1 if bad or compared < 20 else 0


if __name__ == "__main__":
    sys.exit(main())
