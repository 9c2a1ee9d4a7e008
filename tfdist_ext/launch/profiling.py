"""`tfdist-run --profile DIR --profile-steps A-B`: the variables every worker reads.

Kept free of TensorFlow (the launcher does not import it); the workers' side
is `tfdist_ext.keras.job_profile`.
"""

from typing import Tuple

DIR, STEPS = "TFDIST_PROFILE_DIR", "TFDIST_PROFILE_STEPS"
DEFAULT_STEPS = (10, 12)


def parse_steps(text: str, name: str = STEPS) -> Tuple[int, int]:
    """"A-B" as (A, B), 0 <= A <= B.

    Raises:
        ValueError: naming `name`, the value and the form expected.
    """
    first, _, last = text.partition("-")
    if not (first.isdigit() and last.isdigit() and int(first) <= int(last)):
        raise ValueError(f"{name}={text!r} must be two step numbers A-B with 0 <= A <= B "
                         f"(training steps counted from 0 across epochs), e.g. "
                         f"{DEFAULT_STEPS[0]}-{DEFAULT_STEPS[1]}.")
    return int(first), int(last)
