"""Runs several programs one after another in one worker process (a test driver).

    tfdist-run -np N python run_scripts.py OUT SCRIPT [SCRIPT ...]

Each SCRIPT runs as `python SCRIPT OUT/<its name without .py>` would run it:
as `__main__`, with that `sys.argv`, in the order given. A script that must
find TensorFlow untouched (one that creates its strategy after TF has run)
comes first. One launch for several scripts saves a TF worker's start-up
(about 10 s on the 2-core CI machine) per script.
"""

import os
import runpy
import sys


def main(out, *scripts):
    for script in scripts:
        target = os.path.join(out, os.path.splitext(os.path.basename(script))[0])
        os.makedirs(target, exist_ok=True)
        sys.argv = [script, target]
        print(f"run_scripts: {os.path.basename(script)}", flush=True)
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(*sys.argv[1:])
