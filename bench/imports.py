"""The import steps of `python -m bench.footprint`, run as `python -m bench.imports MODE` in a
fresh process: it imports nothing of its own beyond `sys` and `json`, so what it measures is
what the serve path brings.

- `packages`: the modules the serve path loads, grouped by top-level package in the order
  they were first loaded (the standard library as one group);
- `steps PACKAGES`: imports them group by group (the standard library first, then each
  third-party package, then ours), reading VmRSS after each;
- `traced PACKAGES`: the same under tracemalloc, reading the Python heap after each.
"""

import contextlib
import json
import sys

# What `cloudscale-autoscaler serve` imports before it reads its config.
SERVE_PATH = ("cloudscale_autoscaler.cli", "cloudscale_autoscaler.commands.serve")
STDLIB = "standard library"
OURS = "cloudscale_autoscaler"


def rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def packages() -> dict[str, list[str]]:
    before = set(sys.modules)
    for module in SERVE_PATH:
        __import__(module)
    groups: dict[str, list[str]] = {STDLIB: []}
    for name in [m for m in sys.modules if m not in before]:
        top = name.partition(".")[0]
        if top in sys.stdlib_module_names:
            top = STDLIB
        elif top.startswith("_") or top == "cython_runtime":
            continue  # extension modules a package loads by itself (_cffi_backend)
        groups.setdefault(top, []).append(name)
    groups[OURS] = list(SERVE_PATH)  # they load the rest of ours
    ours = groups.pop(OURS)
    return {**groups, OURS: ours}


def steps(groups: dict[str, list[str]], traced: bool) -> dict[str, object]:
    if traced:
        import tracemalloc

        tracemalloc.start()

    def reading() -> int:
        return tracemalloc.get_traced_memory()[0] if traced else rss()

    measured = [{"step": "python", "bytes": reading()}]
    for group, modules in groups.items():
        for module in modules:
            # A module its package loaded under a condition may not import on its own.
            with contextlib.suppress(ImportError):
                __import__(module)
        measured.append({"step": group, "bytes": reading()})
    return {"steps": measured, "modules": len(sys.modules)}


if __name__ == "__main__":
    mode = sys.argv[1]
    result: object
    if mode == "packages":
        result = packages()
    else:
        result = steps(json.loads(sys.argv[2]), traced=mode == "traced")
    print(json.dumps(result))
