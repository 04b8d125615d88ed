"""The Prometheus text exposition format 0.0.4, parsed strictly: the one parser
the Python tests share (node_exporter and rules checks, GPU host comparison;
the Rust tests share tests/support/src/exposition.rs, with the same rules).
Standard library only.

parse(text) -> {Series: value}; raises ParseError naming the line when:
- the text is empty or does not end with a line feed (a truncated file);
- a comment is not `# HELP name text` or `# TYPE name type`, a type is unknown,
  HELP or TYPE comes twice for a name, or TYPE comes after the name's samples;
- HELP text has an escape other than `\\\\` and `\\n`;
- a name is invalid, a label is repeated, a label value has an escape other than
  `\\\\`, `\\"`, `\\n`, or is unterminated;
- a value is not a float, `NaN`, `+Inf` or `-Inf`, or a timestamp follows it;
- a family's lines are not contiguous, or a series repeats.
parse_all(text) -> ({Series: value}, {name: (type, help)}).
"""

import re
from dataclasses import dataclass

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
VALUE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|NaN|[+-]Inf")
COMMENT = re.compile(r"# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*)(?: (.*))?")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class ParseError(Exception):
    pass


@dataclass(frozen=True)
class Series:
    name: str
    labels: tuple = ()  # sorted (name, value) pairs

    def label(self, name, default=None):
        return dict(self.labels).get(name, default)

    def without(self, *names):
        return Series(self.name, tuple((k, v) for k, v in self.labels if k not in names))

    def __str__(self):
        if not self.labels:
            return self.name
        return self.name + "{" + ",".join(f'{k}="{v[:40]}"' for k, v in self.labels) + "}"


def unescape(text, allowed):
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            nxt = text[i + 1:i + 2]
            if nxt not in allowed:
                raise ParseError(f"bad escape \\{nxt}")
            out.append(ESCAPES[nxt])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def parse_sample(line):
    m = NAME.match(line)
    if not m:
        raise ParseError("no metric name")
    name, i, labels = m.group(), m.end(), {}
    if line[i:i + 1] == "{":
        i += 1
        while line[i:i + 1] != "}":
            lm = LABEL.match(line, i)
            if not lm or line[lm.end():lm.end() + 2] != '="':
                raise ParseError(f"bad label at column {i + 1}")
            lname, i = lm.group(), lm.end() + 2
            vm = re.compile(r'((?:[^"\\]|\\.)*)"').match(line, i)
            if not vm:
                raise ParseError(f"unterminated value of label {lname}")
            if lname in labels:
                raise ParseError(f"label {lname} twice")
            labels[lname] = unescape(vm.group(1), '\\"n')
            i = vm.end()
            if line[i:i + 1] == ",":
                i += 1
            elif line[i:i + 1] != "}":
                raise ParseError(f"expected , or }} after label {lname}")
        i += 1
    if line[i:i + 1] != " " or not VALUE.fullmatch(line[i + 1:]):
        raise ParseError(f"bad value {line[i:]!r} (or a timestamp)")
    value = float(line[i + 1:].replace("Inf", "inf").replace("NaN", "nan"))
    return Series(name, tuple(sorted(labels.items()))), value


def parse_all(text):
    """({Series: value}, {name: (type, help)})."""
    if not text:
        raise ParseError("empty")
    if not text.endswith("\n"):
        raise ParseError("does not end with a line feed (truncated?)")
    samples, meta, done, sampled, current = {}, {}, set(), set(), None

    def family(name):
        for kind, suffixes in SUFFIXES.items():
            for suffix in suffixes:
                base = name.removesuffix(suffix)
                if base != name and meta.get(base, ("",))[0] == kind:
                    return base
        return name

    for number, line in enumerate(text[:-1].split("\n"), 1):
        try:
            if line.startswith("#"):
                m = COMMENT.fullmatch(line)
                if not m:
                    raise ParseError("comment is not HELP or TYPE")
                kind, name, rest = m.group(1), m.group(2), m.group(3) or ""
                old = meta.setdefault(name, [None, None])
                slot = 0 if kind == "TYPE" else 1
                if old[slot] is not None:
                    raise ParseError(f"second {kind} for {name}")
                if kind == "TYPE" and (rest not in TYPES or name in sampled):
                    raise ParseError(f"TYPE {rest!r} unknown or after samples of {name}")
                old[slot] = rest if kind == "TYPE" else unescape(rest, "\\n")
                name_family = name
            else:
                series, value = parse_sample(line)
                if series in samples:
                    raise ParseError("duplicate series")
                samples[series] = value
                name_family = family(series.name)
                sampled.add(name_family)
            if name_family != current:
                if name_family in done:
                    raise ParseError(f"lines of {name_family} are not contiguous")
                if current is not None:
                    done.add(current)
                current = name_family
        except ParseError as e:
            raise ParseError(f"line {number}: {e}: {line[:160]!r}") from None
    return samples, {name: tuple(v) for name, v in meta.items()}


def parse(text):
    return parse_all(text)[0]


def load(path):
    with open(path, "rb") as f:
        return parse(f.read().decode("utf-8"))
