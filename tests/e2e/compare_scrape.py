#!/usr/bin/env python3
"""Scrape node_exporter once and check that it serves every series of our file.

usage: compare_scrape.py PORT FILE CASE EXIT_STATUS
Series are compared as (name, sorted labels, value): node_exporter sorts labels
and may print numbers differently, so both sides are parsed (strictly), not
diffed as text.
"""
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from exposition import Series, load, parse  # noqa: E402


def main():
    port, path, case, status = sys.argv[1:5]
    ours = load(path)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        scraped = parse(response.read().decode())
    problems = []
    if scraped.get(Series("node_textfile_scrape_error")) != 0:
        problems.append(f"node_textfile_scrape_error = {scraped.get(Series('node_textfile_scrape_error'))}")
    missing = [s for s in ours if s not in scraped]
    changed = [s for s in ours if s in scraped and scraped[s] != ours[s]]
    if missing:
        problems.append(f"{len(missing)} series not served, e.g. {missing[0]}")
    if changed:
        problems.append(f"{len(changed)} values changed, e.g. {changed[0]}")
    verdict = "ok" if not problems else "FAIL: " + "; ".join(problems)
    print(f"{case:<32} exit {status}  {len(ours):5d} series served  {verdict}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
