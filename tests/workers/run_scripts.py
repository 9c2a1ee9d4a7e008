"""Runs several programs one after another in one worker process (a test driver).

    tfdist-run -np N python run_scripts.py OUT SCRIPT [SCRIPT ...]

A SCRIPT entry runs as `python SCRIPT OUT/<its name without .py>` would run it;
an entry with spaces ("checks.py training") as `python checks.py training`.
Each runs as `__main__`, with that `sys.argv`, in the order given. A script that
must find TensorFlow untouched (one that creates its strategy after TF has
run) comes first. One launch for several scripts saves a TF worker's start-up
(about 10 s on the 2-core CI machine) per script.
"""

import os
import runpy
import shlex
import sys


def main(out, *entries):
    for entry in entries:
        script, *args = shlex.split(entry)
        if not args:
            args = [os.path.join(out, os.path.splitext(os.path.basename(script))[0])]
            os.makedirs(args[0], exist_ok=True)
        sys.argv = [script, *args]
        print(f"run_scripts: {os.path.basename(script)}", flush=True)
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(*sys.argv[1:])
