"""`python -m polyspec.distill train ...`: the distill commands alone, e.g. for
`accelerate launch -m polyspec.distill train ...` on several GPUs or nodes."""

import sys

from polyspec.cli import main

sys.argv[1:1] = ["distill"]
main()
