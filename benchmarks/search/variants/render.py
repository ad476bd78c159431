# Renders a problem's kernel template with its knob defaults and the knob=value settings given:
#   python3 benchmarks/search/variants/render.py problems/cuda_gemm OUT.cu knob=value ...
# A knob the problem does not declare is refused, as kevo refuses it.
import json
import pathlib
import re
import sys

problem = pathlib.Path(sys.argv[1])
manifest = json.load(open(problem / "problem.json"))
knobs = {name: spec["default"] for name, spec in manifest["knobs"].items()}
for setting in sys.argv[3:]:
    name, value = setting.split("=", 1)
    if name not in knobs:
        sys.exit(f"{problem.name} has no knob '{name}'")
    knobs[name] = value
template = open(problem / manifest["template"]).read()
open(sys.argv[2], "w").write(re.sub(r"\$\{(\w+)\}", lambda m: str(knobs[m.group(1)]), template))
