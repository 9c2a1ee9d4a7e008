"""`tfdist-run --elastic`: the variable every worker reads, and the replacement delay.

Kept free of TensorFlow (the launcher does not import it); the workers' side
is `tfdist_ext.elastic.options`, which re-exports both names.
"""

VARIABLE = "TFDIST_ELASTIC"  # "1": elastic=None means True (set by `tfdist-run --elastic`)
# A replacement started sooner after the death than the survivors notice it
# (about a second) answers their health checks in the dead one's place; it is
# taken in later all the same, but the survivors' failed step would be blamed
# on nobody. `tfdist-run --elastic` waits this long before starting one.
REPLACEMENT_DELAY_SECONDS = 2.0
# A replacement the running job cannot take in (its script is in an earlier `fit` than
# the members' one) exits with this code; `tfdist-run --elastic` does not start it again.
EXIT_LATE = 76
# A worker `tfdist-run --elastic` started again finds this file path in the variable and
# creates the file once it is in the job (admitted, or it met every worker at a start). When
# the last worker in the job fails, the launcher stops the replacements without one: there
# is no job left for them to join, and none of them should start the job afresh.
MEMBER_FILE = "TFDIST_MEMBER_FILE"
