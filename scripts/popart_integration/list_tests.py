"""List PopART's Python integration tests as its CMake registers them (file, device variants, -k
expression, disabled) into $PIT_DIR/registered.json. The default variant is Cpu; ${HW_EXCLUDE_C600} is
Hw off a C600 system. usage: python list_tests.py"""
import json
import os
import re

from common import INTEGRATION, REGISTERED

KEYWORDS = ("VARIANTS", "MATCHEXPR", "NUM_WORKERS", "LABELS", "DEPENDS", "PROPERTIES", "TEST_IPUMODEL", "ALLOW_SKIP")


def main():
    out = []
    for dirpath, _, files in os.walk(INTEGRATION):
        if "CMakeLists.txt" not in files:
            continue
        text = "\n".join(line.split("#")[0] for line in open(os.path.join(dirpath, "CMakeLists.txt")))
        for m in re.finditer(r"add_popart_py_unit_test\(([^)]*)\)", text, re.S):
            tokens = m.group(1).split()
            variants, matchexpr, disabled, key = [], None, False, None
            for t in tokens[1:]:
                if t in KEYWORDS:
                    key = t
                elif key == "VARIANTS":
                    variants.append(t.strip('"').replace("${HW_EXCLUDE_C600}", "Hw"))
                elif key == "MATCHEXPR":
                    matchexpr = t
                elif key == "PROPERTIES" and t == "DISABLED":
                    disabled = True
            out.append({"file": os.path.relpath(os.path.join(dirpath, tokens[0] + ".py"), INTEGRATION),
                        "variants": variants or ["Cpu"], "matchexpr": matchexpr, "disabled": disabled})
    json.dump(out, open(REGISTERED, "w"), indent=0)
    print(f"{len(out)} registrations -> {REGISTERED}")


if __name__ == "__main__":
    main()
