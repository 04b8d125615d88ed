#!/usr/bin/env python3
"""Scrape node_exporter once and check that it serves every series of our file.

usage: compare_scrape.py PORT FILE CASE EXIT_STATUS
Series are compared as (name, sorted labels, value): node_exporter sorts labels
and may print numbers differently, so both sides are parsed, not diffed as text.
"""
import re
import sys
import urllib.request

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')


def parse(text):
    series = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        if not match:
            raise ValueError(f"unparsable line: {line!r}")
        name, labels, value = match.groups()
        pairs = tuple(sorted(LABEL.findall(labels or "")))
        key = (name, pairs)
        if key in series:
            raise ValueError(f"duplicate series: {line!r}")
        series[key] = float(value)
    return series


def main():
    port, path, case, status = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    ours = parse(open(path, encoding="utf-8").read())
    scraped_text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    scraped = parse(scraped_text)
    problems = []
    error = [v for (n, _), v in scraped.items() if n == "node_textfile_scrape_error"]
    if error != [0.0]:
        problems.append(f"node_textfile_scrape_error = {error}")
    missing = [k for k in ours if k not in scraped]
    changed = [k for k in ours if k in scraped and scraped[k] != ours[k]]
    if missing:
        problems.append(f"{len(missing)} series not served, e.g. {missing[0]}")
    if changed:
        problems.append(f"{len(changed)} values changed, e.g. {changed[0]}")
    verdict = "ok" if not problems else "FAIL: " + "; ".join(problems)
    print(f"{case:<32} exit {status}  {len(ours):5d} series served  {verdict}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
