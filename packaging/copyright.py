#!/usr/bin/env python3
"""Writes packaging/debian/copyright: packaging/debian/copyright.in with one
DEP-5 Files paragraph per crate linked into the binary.

usage: packaging/copyright.py [--check]

The crates are the binary's normal dependencies, transitively, as Cargo.lock
resolves them for this host's target (`cargo metadata --locked`); build and dev
dependencies, proc-macro crates (they run in the compiler, nothing of them is
linked) and the fake NVML are left out. Each crate's SPDX expression becomes a
DEP-5 one; every license it names needs a License paragraph in the template.
--check exits 1 if the committed file differs (make test runs it).
"""
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "packaging/debian/copyright.in"
OUTPUT = ROOT / "packaging/debian/copyright"
BINARY = "nvidia-textfile-exporter"


def cargo(*args):
    return subprocess.run(["cargo", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def linked_crates():
    host = re.search(r"^host: (\S+)", cargo("-vV"), re.M).group(1)
    meta = json.loads(cargo("metadata", "--locked", "--format-version", "1", "--filter-platform", host))
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    root = next(p["id"] for p in meta["packages"] if p["name"] == BINARY)
    seen, todo = set(), [root]
    while todo:
        for dep in nodes[todo.pop()]["deps"]:
            package = packages[dep["pkg"]]
            normal = any(kind["kind"] is None for kind in dep["dep_kinds"])
            macro = any("proc-macro" in t["kind"] for t in package["targets"])
            if normal and not macro and dep["pkg"] not in seen:
                seen.add(dep["pkg"])
                todo.append(dep["pkg"])
    # The workspace's own crates (no source: a path) are the project's.
    vendored = (packages[i] for i in seen if packages[i]["source"] is not None)
    return sorted(vendored, key=lambda p: (p["name"], p["version"]))


def dep5_license(spdx):
    """'Apache-2.0 WITH LLVM-exception OR MIT' -> 'Apache-2.0 with LLVM exception or MIT'."""
    text = re.sub(r"\s*/\s*", " OR ", spdx.strip())
    text = re.sub(r" WITH ([\w.-]+)-exception", r" with \1 exception", text)
    return text.replace(" OR ", " or ").replace(" AND ", " and ")


def render():
    template = TEMPLATE.read_text(encoding="utf-8")
    defined = set(re.findall(r"^License: (.+)$", template.split("@CRATES@")[1], re.M))
    paragraphs, problems = [], []
    for crate in linked_crates():
        if not crate.get("license"):
            problems.append(f"{crate['name']} {crate['version']}: no SPDX license in its Cargo.toml")
            continue
        license = dep5_license(crate["license"])
        for name in re.split(r" or | and ", license):
            if name not in defined:
                problems.append(f"{crate['name']}: no License paragraph for {name!r} in {TEMPLATE.name}")
        authors = [re.sub(r"\s*<[^>]*>", "", a) for a in crate["authors"]] or [f"the {crate['name']} authors"]
        paragraphs.append(f"Files: vendor/{crate['name']}-{crate['version']}/*\n"
                          f"Copyright: {', '.join(authors)}\nLicense: {license}\n")
    if problems:
        sys.exit("copyright: " + "\n  ".join(problems))
    return template.replace("@CRATES@\n", "\n".join(paragraphs) + "\n")


def main():
    text = render()
    if sys.argv[1:] == ["--check"]:
        if OUTPUT.read_text(encoding="utf-8") != text:
            sys.exit(f"copyright: {OUTPUT.relative_to(ROOT)} is out of date with Cargo.lock; run make copyright")
        print(f"copyright: {OUTPUT.relative_to(ROOT)} lists the {text.count('Files: vendor/')} linked crates")
    elif not sys.argv[1:]:
        OUTPUT.write_text(text, encoding="utf-8")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
