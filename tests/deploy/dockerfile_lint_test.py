#!/usr/bin/python3
"""Lints deploy/docker/Dockerfile.{cpu,cuda} for structure (docker cannot run here):

- instructions parse (continuations, exec-form JSON); a `# syntax=` line; known instructions;
- multi-stage: named stages, COPY --from only names earlier stages, the final stage is a runtime
  stage that installs no compiler and copies the executable from the build stage;
- apt-get: update and install in the same RUN, --no-install-recommends, lists removed, and every
  Debian package of the CPU image exists in Debian 12 (apt-cache, when apt lists are present);
- the runtime stage provides every shared library `ldd build/bin/tandem` needs (when BUILD_DIR
  holds a built executable), mapping libraries to packages with dpkg -S;
- runs as the non-root uid the Helm chart's podSecurityContext expects, set after the last RUN;
  ENTRYPOINT and CMD in exec form; EXPOSE covers the chart's ports; a Dockerfile-specific
  .dockerignore excludes build directories.

Usage: dockerfile_lint_test.py [BUILD_DIR]
"""
import json
import os
import re
import shutil
import subprocess
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploylib import ROOT, check  # noqa: E402

DOCKER_DIR = os.path.join(ROOT, "deploy", "docker")
INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
                "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK",
                "SHELL"}
COMPILERS = {"build-essential", "gcc", "g++", "clang", "cmake", "ninja-build"}


def parse(path):
    """[(line number, INSTRUCTION, argument text)] with continuations joined."""
    out, buf, start = [], "", 0
    lines = open(path).read().split("\n")
    check(lines[0].startswith("# syntax=docker/dockerfile:"), f"{path}: first line # syntax=")
    for n, line in enumerate(lines, 1):
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue  # comment inside a continuation
        if not buf:
            start = n
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        check(word in INSTRUCTIONS, f"{path}:{start}: unknown instruction {word}")
        out.append((start, word, rest.strip()))
        buf = ""
    check(not buf, f"{path}: dangling continuation")
    return out


def stages(instructions):
    result, current = [], None
    for n, word, rest in instructions:
        if word == "FROM":
            m = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
            check(m and m.group(2), f"line {n}: FROM without a stage name: {rest}")
            current = {"name": m.group(2), "base": m.group(1), "body": []}
            result.append(current)
        elif current is not None:
            current["body"].append((n, word, rest))
    return result


def apt_packages(run):
    """Packages named by `apt-get install` in a RUN command (version pins stripped)."""
    pkgs = []
    for cmd in re.split(r"&&|;", run):
        words = cmd.split()
        if "apt-get" in words and "install" in words:
            for w in words[words.index("install") + 1:]:
                if not w.startswith("-"):
                    pkgs.append(w.split("=")[0])
    return pkgs


def check_apt(path, n, run):
    if "apt-get install" not in run:
        return
    check("apt-get update" in run, f"{path}:{n}: apt-get install without update in the same RUN")
    check("--no-install-recommends" in run, f"{path}:{n}: use --no-install-recommends")
    check("rm -rf /var/lib/apt/lists/*" in run, f"{path}:{n}: remove the apt lists")
    check(" -y" in run, f"{path}:{n}: apt-get install -y")


def chart_uid():
    values = yaml.safe_load(open(os.path.join(ROOT, "deploy", "helm", "tandem", "values.yaml")))
    return values["podSecurityContext"]["runAsUser"], values["ports"]


def lint(name, build_dir):
    path = os.path.join(DOCKER_DIR, name)
    ins = parse(path)
    st = stages(ins)
    check(len(st) >= 2, f"{name}: multi-stage build")
    names = [s["name"] for s in st]
    check(len(set(names)) == len(names), f"{name}: duplicate stage names")
    for i, s in enumerate(st):
        check(s["base"] not in names[i:], f"{name}: stage {s['name']} bases on a later stage")
        for n, word, rest in s["body"]:
            check(word != "ADD" or not re.search(r"https?://", rest), f"{name}:{n}: ADD <url>")
            if word == "COPY":
                m = re.search(r"--from=(\S+)", rest)
                if m:
                    check(m.group(1) in names[:i], f"{name}:{n}: COPY --from={m.group(1)}")
            if word == "RUN":
                check_apt(name, n, rest)
    final = st[-1]
    body = final["body"]
    words = [w for _, w, _ in body]
    runtime_pkgs = [p for _, w, r in body if w == "RUN" for p in apt_packages(r)]
    check(not COMPILERS & set(runtime_pkgs), f"{name}: compilers in the runtime stage")
    check(any(w == "COPY" and "--from=build" in r and "/usr/local/bin/tandem" in r
              for _, w, r in body), f"{name}: runtime copies the executable from build")
    uid, ports = chart_uid()
    users = [(i, r) for i, (_, w, r) in enumerate(body) if w == "USER"]
    check(users, f"{name}: no USER in the final stage")
    last_user_index, user = users[-1]
    check(user.split(":")[0] == str(uid), f"{name}: USER {user}, chart runs as {uid}")
    check(all(w != "RUN" for _, w, _ in body[last_user_index:]), f"{name}: RUN after USER")
    check(any(w == "RUN" and f"--uid {uid}" in r for _, w, r in body), f"{name}: creates uid {uid}")
    for w in ("ENTRYPOINT", "CMD"):
        rest = [r for _, x, r in body if x == w]
        check(rest, f"{name}: no {w}")
        check(isinstance(json.loads(rest[-1]), list), f"{name}: {w} not in exec form")
    exposed = {p for _, w, r in body if w == "EXPOSE" for p in r.split()}
    for p in ("router", "worker", "kv", "metrics"):
        check(str(ports[p]) in exposed, f"{name}: EXPOSE lacks the chart's {p} port {ports[p]}")
    ignore = open(path + ".dockerignore").read()
    check("build*/" in ignore and "node_modules" in ignore, f"{name}.dockerignore")
    return st, runtime_pkgs


def apt_candidates(pkgs):
    """{package: candidate version or None}, from one apt-cache call."""
    r = subprocess.run(["apt-cache", "policy"] + sorted(pkgs), capture_output=True, text=True)
    out, current = {p: None for p in pkgs}, None
    for line in r.stdout.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line[:-1]
        elif current and line.strip().startswith("Candidate:"):
            version = line.split(":", 1)[1].strip()
            out[current] = None if version == "(none)" else version
    return out


def check_debian_packages(st):
    if not os.path.isdir("/var/lib/apt/lists") or not shutil.which("apt-cache") or \
            not any("_Packages" in f for f in os.listdir("/var/lib/apt/lists")):
        print("note: no apt lists here; Debian package names not checked")
        return
    pkgs = {p for s in st for _, w, r in s["body"] if w == "RUN" for p in apt_packages(r)}
    missing = [p for p, v in sorted(apt_candidates(pkgs).items()) if v is None]
    check(not missing, f"Dockerfile.cpu: not in Debian 12: {missing}")
    print(f"ok: {len(pkgs)} Debian packages of Dockerfile.cpu exist")


def check_runtime_libraries(build_dir, runtime_pkgs):
    exe = os.path.join(build_dir or "", "bin", "tandem")
    if not build_dir or not os.path.exists(exe):
        print("note: no built tandem; runtime libraries not checked")
        return
    ldd = subprocess.run(["ldd", exe], capture_output=True, text=True, check=True).stdout
    base = {"libc6", "libgcc-s1", "libstdc++6", "libcrypt1", "libzstd1", "liblzma5", "libsystemd0",
            "libgcrypt20", "libgpg-error0", "liblz4-1", "libcap2", "libudev1"}
    libs = {}
    for line in ldd.splitlines():
        m = re.search(r"=>\s+(\S+)", line)
        if m and os.path.exists(m.group(1)):
            libs[os.path.realpath(m.group(1))] = os.path.basename(m.group(1))
    # One dpkg -S for all libraries: "package:arch: /path" per line.
    r = subprocess.run(["dpkg", "-S"] + sorted(libs), capture_output=True, text=True)
    needed = {}
    for line in r.stdout.splitlines():
        owner, _, path = line.partition(": ")
        if path in libs:
            needed.setdefault(owner.split(":")[0].split(",")[0], []).append(libs[path])
    check(sum(len(v) for v in needed.values()) >= len(libs) // 2,
          f"dpkg -S found owners for too few libraries:\n{r.stderr}")
    # Packages pulled in as dependencies of the listed ones count as provided.
    closure = set(runtime_pkgs) | base
    deps = subprocess.run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                           "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"]
                          + runtime_pkgs, capture_output=True, text=True).stdout
    closure |= {ln.strip() for ln in deps.splitlines() if ln and not ln.startswith(" ")}
    closure |= {ln.split(":", 1)[1].strip() for ln in deps.splitlines() if "Depends:" in ln}
    missing = {p: libs for p, libs in needed.items() if p not in closure}
    check(not missing, f"the runtime stage lacks packages for {missing}")
    print(f"ok: runtime stage provides all {sum(len(v) for v in needed.values())} shared "
          f"libraries of {exe}")


def main():
    build_dir = sys.argv[1] if len(sys.argv) > 1 else None
    cpu, cpu_runtime = lint("Dockerfile.cpu", build_dir)
    lint("Dockerfile.cuda", build_dir)
    print("ok: Dockerfile.cpu and Dockerfile.cuda structure")
    check_debian_packages(cpu)
    check_runtime_libraries(build_dir, cpu_runtime)
    print("PASS")


if __name__ == "__main__":
    main()
