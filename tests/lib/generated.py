"""What the exporter says about itself (`--generate`), so that tests take metric
families and exit statuses from the binary instead of restating them.

  families(binary)    {name: Family} from `--generate families`
                      (name TAB type TAB labels beyond gpu,uuid TAB help)
"""

import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    type: str
    labels: tuple  # label names beyond gpu and uuid
    help: str


def generate(binary, what):
    out = subprocess.run([str(binary), "--generate", what], check=True, capture_output=True,
                         text=True, timeout=30).stdout
    return [line.split("\t") for line in out.splitlines() if line]


def families(binary):
    found = {}
    for row in generate(binary, "families"):
        if len(row) != 4:
            raise ValueError(f"--generate families: not 4 fields: {row}")
        name, kind, labels, text = row
        found[name] = Family(name, kind, tuple(label for label in labels.split(",") if label), text)
    return found

