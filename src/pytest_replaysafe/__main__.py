"""``python -m pytest_replaysafe COMMAND``: the plugin's commands outside pytest.

merge SHARD.json... --out merged.json   every shard's --crash-report into one report (report.merge)
compare BEFORE.json AFTER.json          the cells whose outcome changed between two reports (report.compare)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

USAGE = (
    "usage: python -m pytest_replaysafe merge SHARD.json... --out merged.json [--markdown M.md] [--html H.html]\n"
    "       python -m pytest_replaysafe compare BEFORE.json AFTER.json"
)


def main(argv: Sequence[str]) -> int:
    command, *rest = argv or ("",)
    if command == "merge":
        from pytest_replaysafe.report.merge import main as merge

        return merge(rest)
    if command == "compare":
        from pytest_replaysafe.report.compare import main as compare

        return compare(rest)
    print(f"unknown command {command!r}\n{USAGE}" if command else USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
